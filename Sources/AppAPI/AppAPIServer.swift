internal import AppleClient
import CryptoCore
import Locking
import Foundation
internal import HTTPServer
import JSON
package import Logging
package import Postgres
package import AppleJobs
package import Metrics
import Settings
import StoredTokens
import SiwaModel

/// The app API (Sources/AppAPI/README.md), served by `siwa-worker` on `SIWA_APP_API_LISTEN` for apps
/// that do not share this database: nonces, sign-in, an account's state, deletion, the change feed.
///
/// A request runs as every `HTTPServer`'s does (Sources/HTTPServer/README.md): read by
/// libmicrohttpd's pool, answered by a task on the standard executors whose statements wait on
/// their connection's queue and whose calls to Apple wait on the HTTP client's thread, each under
/// its bound. Three times the request timeout after it arrived (30 s by default: past the sum of a
/// request's own bounds), a client that has gone, and `stop()` cancel that task: its statement is
/// cancelled at the server, its call out dropped, and it answers at once.
///
/// Every request is authenticated first (bearer token, constant-time), as soon as its headers are
/// in: before its body is read, its target decoded, routing or any other work (`HTTPServer`'s
/// `admit`). Bodies are at most 16 KiB (larger: 413 from the HTTP layer, unread). Database
/// calls are bounded (`AppAPIStore`), Apple calls at 5 s. Internal network only.
///
/// The edge (Sources/AppAPI/README.md, "The edge"): a request must arrive whole within
/// `SIWA_APP_API_REQUEST_TIMEOUT`, one address holds at most `SIWA_APP_API_CONNECTIONS_PER_ADDRESS`
/// connections (more are closed as they are accepted), and both are counted
/// (`siwa_app_api_connections_refused_total`) and logged (`AppAPIRefusalLog`).
package final class AppAPIServer: Sendable {
    /// Largest request body read.
    static let maximumBodyBytes = 16 * 1024
    /// Bound on every call to Apple made while a request waits.
    package static let appleTimeout: Duration = .seconds(5)
    /// Bound on every database call made while a request waits (after the pool's own lease wait).
    package static let databaseTimeout: Duration = .seconds(5)

    package let configuration: AppAPIConfiguration
    private let tokens: [[UInt8]]
    private let store: AppAPIStore
    private let signIn: SignIn
    private let keys: AppleKeySet
    private let metrics: AppAPIMetrics
    private let logger: Logger
    private let refusalLog: AppAPIRefusalLog
    /// Until when `POST /v1/nonces` answers 429 without asking the database: the cap was found
    /// reached, and counting up to it again on every request would let a client keep the database busy.
    private let noncesRefusedUntil = Locked<(until: ContinuousClock.Instant, retryAfter: Int)?>(nil)
    private let server: Locked<HTTPServer?> = Locked(nil)

    /// - Parameters:
    ///   - apple: the Apple handlers' context: its key set, token box and signer are the ones used here.
    ///   - pool: the API's own connections (its lease wait bounds how long a request queues for one).
    ///   - appleTimeout, databaseTimeout: the bounds (tests on a loaded machine widen the database's).
    package init(
        configuration: AppAPIConfiguration, clientIDs: [String], apple: AppleJobContext, pool: PostgresPool,
        registry: MetricsRegistry, logger: Logger, appleTimeout: Duration = appleTimeout,
        databaseTimeout: Duration = databaseTimeout
    ) {
        self.configuration = configuration
        tokens = configuration.tokens.map { Array($0.utf8) }
        store = AppAPIStore(pool: pool, timeout: databaseTimeout)
        keys = apple.identityVerifier.keys
        metrics = AppAPIMetrics(registry: registry)
        self.logger = logger
        refusalLog = AppAPIRefusalLog(logger: logger)
        let client = AppleAuthClient(
            http: AppleHTTP(baseURL: apple.client.http.baseURL, timeout: appleTimeout, caCertificates: apple.client.http.caCertificates), signer: apple.client.signer)
        signIn = SignIn(
            store: store, verifier: apple.identityVerifier, client: client, tokenBox: apple.tokenBox,
            clientIDs: Set(clientIDs), metrics: metrics, logger: logger)
    }

    /// The bound port (the real one when configured with 0); 0 when not running.
    package var port: Int { server.withLock { $0?.port ?? 0 } }

    /// Serves until the task is cancelled; keeps Apple's keys warm and prunes expired nonces meanwhile.
    package func run() async throws {
        var settings = HTTPServer.Configuration(
            host: configuration.listen.host, port: configuration.listen.port, connectionLimit: 512,
            perIPConnectionLimit: configuration.connectionsPerAddress,
            // Idle a little less than the request deadline, so that the connections the deadline
            // cuts (and counts) are ones that sent something, not kept-alive ones gone quiet.
            connectionTimeout: max(.seconds(1), min(.seconds(30), configuration.requestTimeout - .seconds(1))),
            maxBodyBytes: Self.maximumBodyBytes, shutdownGracePeriod: .seconds(5),
            requestDeadline: configuration.requestTimeout, workDeadline: configuration.requestTimeout * 3)
        settings.admit = { [self] header in isAuthorized(header("Authorization")) ? nil : AppAPIError.unauthorized.response }
        settings.onRefusal = { [metrics, refusalLog] reason, count in
            metrics.connectionsRefused(reason.rawValue, count: count)
            refusalLog.record(reason.rawValue, count: count)
        }
        let http = HTTPServer(configuration: settings, logger: logger, asyncRespond: { [self] request in await respond(to: request) })
        // `port` reads the server's own, 0 until it has started and again once it has stopped.
        server.withLock { $0 = http }
        defer { server.withLock { $0 = nil } }
        try await http.run { [self] in
            logger.info(
                "siwa-worker app API listening",
                metadata: ["app_api.listen": .string("\(configuration.listen.host):\(http.port)"), "app_api.tokens": .int(tokens.count)])
            await withTaskGroup(of: Void.self) { group in
                group.addTask { await self.keys.run() }
                group.addTask { await self.pruneLoop() }
            }
        }
    }

    /// Every 30 s: deletes every expired nonce, in batches (so each is gone within a minute of
    /// expiring, however fast they were issued: at most `SIWA_NONCE_MAX_UNSPENT` can be waiting),
    /// and logs the connection refusals a quiet minute left unlogged.
    private func pruneLoop() async {
        let batch = 10_000
        while !Task.isCancelled {
            var pruned = 0
            do {
                var last = batch
                while last == batch, !Task.isCancelled {
                    last = try await store.pruneNonces(limit: batch)
                    pruned += last
                }
                let prunedWeb = try await store.pruneWebSignIns()
                if prunedWeb > 0 { logger.debug("expired web sign-in states and tickets pruned", metadata: ["web_sign_in.pruned": .int(prunedWeb)]) }
            } catch {
                logger.warning("could not prune expired nonces", metadata: ["error": "\(error)"])
            }
            if pruned > 0 { logger.debug("expired nonces pruned", metadata: ["nonces.pruned": .int(pruned)]) }
            refusalLog.flush()
            try? await Task.sleep(for: .seconds(30))
        }
    }

    // MARK: Requests

    /// Authentication, then routing; counts every answer by endpoint and status.
    func respond(to request: HTTPRequest) async -> HTTPResponse {
        let started = ContinuousClock.now
        let (endpoint, response) = await route(request)
        metrics.request(endpoint: endpoint, status: response.status)
        if endpoint == "sign_in" { metrics.signInSeconds.observe((ContinuousClock.now - started).seconds) }
        return response
    }

    /// Matches the request against `AppAPIEndpoints` (a known path with another method: 405), checks
    /// its input against the same declaration, and hands it to the endpoint's handler.
    private func route(_ request: HTTPRequest) async -> (endpoint: String, HTTPResponse) {
        // Authorized already: the HTTP layer asked `isAuthorized` as the headers came in.
        let parts = request.path.split(separator: "/", omittingEmptySubsequences: false).dropFirst().map(String.init)
        var pathKnown = false
        for endpoint in AppAPIEndpoints.all {
            guard let parameters = endpoint.match(parts) else { continue }
            pathKnown = true
            guard endpoint.method == request.method else { continue }
            switch AppAPIInput.decode(endpoint, parameters: parameters, body: request.body, query: request.query) {
            case .failure(let error): return (endpoint.name, error.response)
            case .success(let input): return (endpoint.name, await handle(endpoint, input))
            }
        }
        return ("other", (pathKnown ? AppAPIError.methodNotAllowed : AppAPIError.notFound).response)
    }

    private func handle(_ endpoint: AppAPIEndpoint, _ input: AppAPIInput) async -> HTTPResponse {
        let clientID = input.parameters["client_id"] ?? ""
        let sub = input.parameters["sub"] ?? ""
        switch endpoint.name {
        case AppAPIEndpoints.nonces.name: return await issueNonce()
        case AppAPIEndpoints.signIn.name: return await signIn(input)
        case AppAPIEndpoints.account.name: return await account(clientID: clientID, sub: sub)
        case AppAPIEndpoints.accountPatch.name: return await patchAccount(clientID: clientID, sub: sub, input)
        case AppAPIEndpoints.deletion.name: return await deletion(clientID: clientID, sub: sub, input)
        case AppAPIEndpoints.changes.name: return await changes(input)
        case AppAPIEndpoints.openAPI.name: return openAPIDocument
        default: return AppAPIError.notFound.response
        }
    }

    /// Written once: the declarations do not change while the process runs.
    private let openAPIDocument = AppAPIJSON.response(AppAPIOpenAPI.document())

    /// `Authorization: Bearer <token>` matching one configured token. Every configured token is
    /// compared (constant time each), so the answer's timing says nothing about which came close.
    private func isAuthorized(_ header: String?) -> Bool {
        guard let header, header.count > 7,
            header.prefix(7).lowercased() == "bearer "
        else { return false }
        let presented = Array(header.dropFirst(7).utf8)
        var matched = false
        for token in tokens where ConstantTime.equals(presented, token) { matched = true }
        return matched
    }

    private func issueNonce() async -> HTTPResponse {
        // 256 random bits, base64url: the raw nonce goes to the app; only its hash is stored.
        let nonce = Base64URL.encode(SecureRandom.bytes(count: 32))
        if let refused = noncesRefusedUntil.withLock({ $0 }), ContinuousClock.now < refused.until {
            return tooManyNonces(retryAfter: refused.retryAfter)
        }
        do {
            switch try await store.issueNonce(
                hash: SHA256.hash(Array(nonce.utf8)), lifetime: configuration.nonceLifetime,
                maximumUnspent: configuration.maximumUnspentNonces)
            {
            case .issued(let expires):
                return AppAPIJSON.response(status: 201, ["nonce": nonce, "expires_at": AppAPIJSON.timestamp(expires)])
            case .full(let retryAfter):
                noncesRefusedUntil.withLock { $0 = (ContinuousClock.now + .seconds(1), retryAfter) }
                logger.debug("nonce refused: SIWA_NONCE_MAX_UNSPENT reached")
                return tooManyNonces(retryAfter: retryAfter)
            }
        } catch {
            logger.warning("could not issue a nonce", metadata: ["error": "\(error)"])
            return AppAPIError.database(error).response
        }
    }

    private func tooManyNonces(retryAfter: Int) -> HTTPResponse {
        var response = AppAPIError.tooManyNonces.response
        response.headers.append(("Retry-After", String(max(1, retryAfter))))
        return response
    }

    private func signIn(_ input: AppAPIInput) async -> HTTPResponse {
        let outcome =
            if let ticket = input.string("ticket") {
                await TicketSignIn(store: store, signIn: signIn, logger: logger).run(ticket: ticket)
            } else {
                await signIn.run(SignIn.Request(input))
            }
        switch outcome {
        case .success(let body): return AppAPIJSON.response(body)
        case .failure(let error): return error.response
        }
    }

    private func account(clientID: String, sub: String) async -> HTTPResponse {
        do {
            guard let account = try await store.account(clientID: clientID, sub: sub) else {
                return AppAPIError.accountNotFound.response
            }
            return AppAPIJSON.response(AppAPIJSON.account(account))
        } catch {
            logger.warning("could not read an account", metadata: ["error": "\(error)"])
            return AppAPIError.database(error).response
        }
    }

    private func patchAccount(clientID: String, sub: String, _ input: AppAPIInput) async -> HTTPResponse {
        do {
            guard let account = try await store.setAppUserID(clientID: clientID, sub: sub, appUserID: input.string("app_user_id"))
            else { return AppAPIError.accountNotFound.response }
            return AppAPIJSON.response(AppAPIJSON.account(account))
        } catch {
            logger.warning("could not update an account", metadata: ["error": "\(error)"])
            return AppAPIError.database(error).response
        }
    }

    /// As `siwa.request_deletion`; without a code, only for an account that exists (nothing is
    /// created for an unknown `sub`). Answers the account's status after the call.
    private func deletion(clientID: String, sub: String, _ input: AppAPIInput) async -> HTTPResponse {
        let code = input.string("authorization_code", emptyIsAbsent: true)
        do {
            guard let requested = try await store.requestDeletion(clientID: clientID, sub: sub, authorizationCode: code) else {
                return AppAPIError.accountNotFound.response
            }
            return AppAPIJSON.response(status: 202, ["job_id": requested.job, "status": requested.status.rawValue])
        } catch {
            logger.warning("could not request a deletion", metadata: ["error": "\(error)"])
            return AppAPIError.database(error).response
        }
    }

    private func changes(_ input: AppAPIInput) async -> HTTPResponse {
        let after = input.query["after"] ?? 0
        let limit = Int(input.query["limit"] ?? 100)
        do {
            let changes = try await store.changes(after: after, limit: limit)
            return AppAPIJSON.response(["changes": changes.map(AppAPIJSON.change), "next": changes.last?.id ?? after])
        } catch {
            logger.warning("could not read account changes", metadata: ["error": "\(error)"])
            return AppAPIError.database(error).response
        }
    }
}
