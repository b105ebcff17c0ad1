internal import AppleClient
import CryptoCore
import Dispatch
import Locking
import Foundation
internal import HTTPServer
import JSON
package import Logging
package import Postgres
package import AppleJobs
package import Metrics
import Settings

/// The app API (CONTRACT.md, "App API"), served by `siwa-worker` on `SIWA_APP_API_LISTEN` for apps
/// that do not share this database: nonces, sign-in, an account's state, deletion, the change feed.
///
/// Each connection has a thread of its own, and a request runs to its end on it (`CallingThread`):
/// its database statements (under their bounds) and its calls to Apple run inline there, so a
/// sign-in crosses no thread of ours between its bytes arriving and its answer leaving. A thread
/// per connection bounds the threads by the connection limit (512).
///
/// Every request is authenticated first (bearer token, constant-time), before routing or any
/// other work. Bodies are at most 16 KiB (larger: 413 from the HTTP layer, unread). Database
/// calls are bounded (`AppAPIStore`), Apple calls at 5 s. Internal network only.
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
        let http = HTTPServer(
            configuration: .init(
                host: configuration.listen.host, port: configuration.listen.port, connectionLimit: 512,
                connectionTimeout: .seconds(30), maxBodyBytes: Self.maximumBodyBytes, shutdownGracePeriod: .seconds(5),
                threadPerConnection: true),
            logger: logger, respondOnConnectionThread: { [self] request in await respond(to: request) })
        try http.start()
        server.withLock { $0 = http }
        logger.info(
            "siwa-worker app API listening",
            metadata: ["app_api.listen": .string("\(configuration.listen.host):\(http.port)"), "app_api.tokens": .int(tokens.count)])
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await self.keys.run() }
            group.addTask { await self.pruneLoop() }
            while !Task.isCancelled { try? await Task.sleep(for: .seconds(3600)) }
            group.cancelAll()
        }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            DispatchQueue.global().async {
                http.stop()
                continuation.resume()
            }
        }
        server.withLock { $0 = nil }
    }

    private func pruneLoop() async {
        while !Task.isCancelled {
            do {
                let pruned = try await store.pruneNonces()
                if pruned > 0 { logger.debug("expired nonces pruned", metadata: ["nonces.pruned": .int(pruned)]) }
                let prunedWeb = try await store.pruneWebSignIns()
                if prunedWeb > 0 { logger.debug("expired web sign-in states and tickets pruned", metadata: ["web_sign_in.pruned": .int(prunedWeb)]) }
            } catch {
                logger.warning("could not prune expired nonces", metadata: ["error": "\(error)"])
            }
            try? await Task.sleep(for: .seconds(60))
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
        guard isAuthorized(request) else { return ("unauthorized", AppAPIError.unauthorized.response) }
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
    private func isAuthorized(_ request: HTTPRequest) -> Bool {
        guard let header = request.header("authorization"), header.count > 7,
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
        do {
            let expires = try await store.issueNonce(hash: SHA256.hash(Array(nonce.utf8)), lifetime: configuration.nonceLifetime)
            return AppAPIJSON.response(status: 201, ["nonce": nonce, "expires_at": AppAPIJSON.timestamp(expires)])
        } catch {
            logger.warning("could not issue a nonce", metadata: ["error": "\(error)"])
            return AppAPIError.database(error).response
        }
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
            return AppAPIJSON.response(status: 202, ["job_id": requested.job, "status": requested.status])
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
