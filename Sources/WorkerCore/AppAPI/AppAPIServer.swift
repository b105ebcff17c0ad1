internal import AppleClient
import CryptoCore
import Dispatch
import Locking
import Foundation
internal import HTTPServer
import JSON
package import Logging
package import Postgres
package import SiwaCore

/// The app API (CONTRACT.md, "App API"), served by `siwa-worker` on `SIWA_APP_API_LISTEN` for apps
/// that do not share this database: nonces, sign-in, an account's state, deletion, the change feed.
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
                host: configuration.listen.host, port: configuration.listen.port, threadCount: 2, connectionLimit: 512,
                connectionTimeout: .seconds(30), maxBodyBytes: Self.maximumBodyBytes, shutdownGracePeriod: .seconds(5)),
            logger: logger, asyncRespond: { [self] request in await respond(to: request) })
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

    private func route(_ request: HTTPRequest) async -> (endpoint: String, HTTPResponse) {
        guard isAuthorized(request) else { return ("unauthorized", AppAPIError.unauthorized.response) }
        let parts = request.path.split(separator: "/", omittingEmptySubsequences: false).dropFirst().map(String.init)
        switch (request.method, parts.count, parts.first, parts.dropFirst().first) {
        case ("POST", 2, "v1", "nonces"): return ("nonces", await issueNonce())
        case ("POST", 2, "v1", "sign-in"): return ("sign_in", await signIn(request))
        case ("GET", 2, "v1", "changes"): return ("changes", await changes(request))
        case ("GET", 4, "v1", "accounts"): return ("account", await account(clientID: parts[2], sub: parts[3]))
        case ("PATCH", 4, "v1", "accounts"): return ("account_patch", await patchAccount(clientID: parts[2], sub: parts[3], request))
        case ("POST", 5, "v1", "accounts") where parts[4] == "deletion":
            return ("deletion", await deletion(clientID: parts[2], sub: parts[3], request))
        case (_, 2, "v1", "nonces"), (_, 2, "v1", "sign-in"), (_, 2, "v1", "changes"), (_, 4, "v1", "accounts"):
            return ("other", AppAPIError.methodNotAllowed.response)
        case (_, 5, "v1", "accounts") where parts[4] == "deletion":
            return ("other", AppAPIError.methodNotAllowed.response)
        default:
            return ("other", AppAPIError.notFound.response)
        }
    }

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
            return AppAPIError.databaseUnavailable.response
        }
    }

    private func signIn(_ request: HTTPRequest) async -> HTTPResponse {
        guard let parsed = SignIn.Request(body: request.body) else { return AppAPIError.badRequest.response }
        switch await signIn.run(parsed) {
        case .success(let body): return AppAPIJSON.response(body)
        case .failure(let error): return error.response
        }
    }

    private func account(clientID: String, sub: String) async -> HTTPResponse {
        guard !clientID.isEmpty, !sub.isEmpty else { return AppAPIError.accountNotFound.response }
        do {
            guard let account = try await store.account(clientID: clientID, sub: sub) else {
                return AppAPIError.accountNotFound.response
            }
            return AppAPIJSON.response(AppAPIJSON.account(account))
        } catch {
            logger.warning("could not read an account", metadata: ["error": "\(error)"])
            return AppAPIError.databaseUnavailable.response
        }
    }

    private func patchAccount(clientID: String, sub: String, _ request: HTTPRequest) async -> HTTPResponse {
        guard let object = JSONValue.object(request.body), let field = object["app_user_id"] else {
            return AppAPIError.badRequest.response
        }
        let appUserID: String?
        switch field {
        case .string(let text): appUserID = text
        case .null: appUserID = nil
        default: return AppAPIError.badRequest.response
        }
        guard !clientID.isEmpty, !sub.isEmpty else { return AppAPIError.accountNotFound.response }
        do {
            guard let account = try await store.setAppUserID(clientID: clientID, sub: sub, appUserID: appUserID) else {
                return AppAPIError.accountNotFound.response
            }
            return AppAPIJSON.response(AppAPIJSON.account(account))
        } catch {
            logger.warning("could not update an account", metadata: ["error": "\(error)"])
            return AppAPIError.databaseUnavailable.response
        }
    }

    private func deletion(clientID: String, sub: String, _ request: HTTPRequest) async -> HTTPResponse {
        var code: String?
        if !request.body.isEmpty {
            guard let object = JSONValue.object(request.body) else { return AppAPIError.badRequest.response }
            switch object["authorization_code"] {
            case nil, .null?: code = nil
            case .string(let text)?: code = text.isEmpty ? nil : text
            default: return AppAPIError.badRequest.response
            }
        }
        guard !clientID.isEmpty, !sub.isEmpty else { return AppAPIError.badRequest.response }
        do {
            let job = try await store.requestDeletion(clientID: clientID, sub: sub, authorizationCode: code)
            return AppAPIJSON.response(status: 202, ["job_id": job, "status": "pending_deletion"])
        } catch let error as PostgresError where error.sqlState == "22023" {
            return AppAPIError.badRequest.response
        } catch {
            logger.warning("could not request a deletion", metadata: ["error": "\(error)"])
            return AppAPIError.databaseUnavailable.response
        }
    }

    private func changes(_ request: HTTPRequest) async -> HTTPResponse {
        let after: Int64
        let limit: Int
        if let text = request.query["after"] {
            guard let value = Int64(text), value >= 0 else { return AppAPIError.badRequest.response }
            after = value
        } else {
            after = 0
        }
        if let text = request.query["limit"] {
            guard let value = Int(text), (1...1000).contains(value) else { return AppAPIError.badRequest.response }
            limit = value
        } else {
            limit = 100
        }
        do {
            let changes = try await store.changes(after: after, limit: limit)
            return AppAPIJSON.response(["changes": changes.map(AppAPIJSON.change), "next": changes.last?.id ?? after])
        } catch {
            logger.warning("could not read account changes", metadata: ["error": "\(error)"])
            return AppAPIError.databaseUnavailable.response
        }
    }
}
