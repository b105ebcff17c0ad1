import AppleClient
package import CryptoCore
package import Foundation
package import HTTPServer
package import JOSE
package import Logging
import Locking
import Metrics

/// A local stand-in for Apple's Sign in with Apple endpoints, for tests and `siwa dev`. TEST ONLY:
/// it publishes its private signing key at `GET /fake/signing-key` so `siwa simulate` can sign
/// notifications.
///
/// It checks what Apple checks on `/auth/token` and `/auth/revoke` (client_secret signature and
/// claims, form fields, grant types, single-use codes) and can be told to fail:
/// - `GET /auth/keys`: its RSA public key (`kid` `fake-1`).
/// - `POST /auth/token`: `authorization_code` (codes from `POST /fake/codes`, single use, 5 min)
///   and `refresh_token` grants.
/// - `POST /auth/revoke`: 200, also for an unknown token; the token stops refreshing.
/// - `POST /auth/token` `client_credentials` with `scope=user.migration`: a migration access token.
/// - `POST /auth/usermigrationinfo` (team transfer, see `FakeApple+Migration.swift`).
/// - `POST /fake/codes` `{client_id, sub, email?, is_private_email?, redirect_uri?}` → `{"code": ...}`;
///   a code with a `redirect_uri` (a web authorization's) is exchanged only with the same one.
/// - `POST /fake/identity-tokens` `{client_id, sub, nonce, email?, is_private_email?, redirect_uri?,
///   real_user_status?}` → `{"identity_token": ..., "authorization_code": ...}` (sign-in, as the
///   device or the web page receives it).
/// - `POST /fake/failures` `{endpoint: "token"|"revoke"|"keys"|"usermigrationinfo", responses: [503, "timeout",
///   "invalid_client", "bad_signature", "slow", ...], retry_after: 2}`: consumed one per call.
/// - `GET /fake/calls`: every call (endpoint, client_id, status, time), never a secret.
/// - `GET /fake/signing-key`: `{"kid": ..., "pem": ...}`, the private key (fake only).
package final class FakeApple: Sendable {
    package struct Configuration: Sendable {
        package var host: String
        package var port: Int
        /// Public key of the team's `.p8`; client_secret signatures are checked against it when set.
        package var verifyKey: P256.Signing.PublicKey?
        /// Expected client_secret `iss`, when set.
        package var teamID: String?
        /// How long an authorization code stays valid.
        package var codeLifetime: TimeInterval
        /// How long an injected `timeout` holds the request before answering 504 (and `slow` before
        /// its real answer).
        package var hangDuration: Duration
        /// Key id of the signing key.
        package var keyID: String
        /// Teams besides `teamID` whose client_secrets are accepted (team transfer: sender and recipient).
        package var otherTeams: [Team]
        /// How long a migration access token is accepted.
        package var migrationTokenLifetime: TimeInterval
        /// Serve `https://` with this certificate and key (as Apple does); nil for `http://`.
        package var tls: TLSIdentity?

        package init(
            host: String = "127.0.0.1", port: Int = 0, verifyKey: P256.Signing.PublicKey? = nil,
            teamID: String? = nil, codeLifetime: TimeInterval = 300, hangDuration: Duration = .seconds(30),
            keyID: String = "fake-1", otherTeams: [Team] = [], migrationTokenLifetime: TimeInterval = 3600,
            tls: TLSIdentity? = nil
        ) {
            self.tls = tls
            self.host = host
            self.port = port
            self.verifyKey = verifyKey
            self.teamID = teamID
            self.codeLifetime = codeLifetime
            self.hangDuration = hangDuration
            self.keyID = keyID
            self.otherTeams = otherTeams
            self.migrationTokenLifetime = migrationTokenLifetime
        }

        /// Every configured team (`teamID` first); empty when none is: then any `iss` is accepted.
        package var teams: [Team] {
            (teamID.map { [Team(id: $0, verifyKey: verifyKey)] } ?? []) + otherTeams
        }
    }

    /// A developer team: its ID (the client_secret `iss`) and the public key of its `.p8`.
    package struct Team: Sendable {
        package var id: String
        /// Signatures are checked against it when set (else only their shape).
        package var verifyKey: P256.Signing.PublicKey?

        package init(id: String, verifyKey: P256.Signing.PublicKey?) {
            self.id = id
            self.verifyKey = verifyKey
        }
    }

    package static let issuer = "https://appleid.apple.com"

    package let configuration: Configuration
    /// The key notifications and id_tokens are signed with. TEST ONLY.
    package let signingKey: RSA.PrivateKey
    let foreignKey: RSA.PrivateKey
    let state = Locked(FakeAppleState())
    private let logger: Logger
    private let server: Locked<HTTPServer?> = Locked(nil)

    package init(configuration: Configuration = Configuration(), signingKey: RSA.PrivateKey? = nil, logger: Logger) throws {
        self.configuration = configuration
        self.signingKey = try signingKey ?? RSA.PrivateKey.generate()
        self.foreignKey = try RSA.PrivateKey.generate()
        self.logger = logger
    }

    // MARK: Running

    /// Starts listening; returns once connections are accepted.
    package func start() throws {
        let server = HTTPServer(
            configuration: .init(
                host: configuration.host, port: configuration.port, threadCount: 2, connectionTimeout: .seconds(60),
                shutdownGracePeriod: .milliseconds(200), tls: configuration.tls),
            handler: ClosureHTTPHandler { [self] request, respond in handle(request, respond: respond) },
            logger: logger)
        try server.start()
        self.server.withLock { $0 = server }
    }

    package func stop() {
        let server = self.server.withLock { server in
            defer { server = nil }
            return server
        }
        server?.stop()
    }

    /// Starts, runs until cancelled, stops.
    package func run() async throws {
        try start()
        while !Task.isCancelled { try? await Task.sleep(for: .seconds(3600)) }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            DispatchQueue.global().async {
                self.stop()
                continuation.resume()
            }
        }
    }

    package var port: Int { server.withLock { $0?.port ?? 0 } }
    package var baseURL: URL { URL(string: "\(configuration.tls == nil ? "http" : "https")://\(configuration.host):\(port)")! }

    // MARK: Test API (the same as the admin endpoints)

    /// A fresh single-use authorization code for `(clientID, sub)`. Secret-like: never log it.
    /// `redirectURI`: a web authorization's (Services ID, Android): the exchange must send the same
    /// `redirect_uri`, or Apple answers `invalid_grant`.
    package func registerCode(
        clientID: String, sub: String, email: String? = nil, isPrivateEmail: Bool? = nil, redirectURI: String? = nil
    ) -> String {
        let code = "c" + Self.randomHex(16)
        state.withLock {
            $0.codes[code] = .init(
                clientID: clientID, sub: sub, email: email, isPrivateEmail: isPrivateEmail, createdAt: Date(), redirectURI: redirectURI)
        }
        return code
    }

    /// What a device receives from Apple at sign-in: an identity token signed with the fake's key
    /// (its `nonce` claim is `nonce` as given) and a single-use authorization code for the same
    /// user. Both are secrets: never log them.
    package func issueIdentityToken(
        clientID: String, sub: String, nonce: String, email: String? = nil, isPrivateEmail: Bool? = nil,
        redirectURI: String? = nil, realUserStatus: Int? = nil
    ) -> (identityToken: String, authorizationCode: String) {
        let code = registerCode(clientID: clientID, sub: sub, email: email, isPrivateEmail: isPrivateEmail, redirectURI: redirectURI)
        let token = signIDToken(
            clientID: clientID, sub: sub, email: email, isPrivateEmail: isPrivateEmail, nonce: nonce, realUserStatus: realUserStatus)
        return (token, code)
    }

    /// Registers a refresh token as if a code exchange had issued it at `issuedAt` (imports,
    /// reconciliation tests).
    /// A token dated before a grant the user has since ended is dead from the start, as Apple's would be.
    package func registerRefreshToken(_ token: String, clientID: String, sub: String, issuedAt: Date = Date()) {
        state.withLock { state in
            let ended = state.grantEnds[FakeAppleState.grantKey(clientID, sub)]?.contains { issuedAt < $0 } ?? false
            state.refreshTokens[token] = .init(clientID: clientID, sub: sub, revoked: ended, issuedAt: issuedAt)
        }
    }

    /// Queues answers for the next calls to `endpoint`, of every client ID or only of `clientID`
    /// (a client ID's own queue is used first).
    package func injectFailures(
        endpoint: String, clientID: String? = nil, responses: [FakeAppleFailure], retryAfter: String? = nil
    ) {
        let key = FakeAppleState.failureKey(endpoint, clientID)
        state.withLock { $0.failures[key] = .init(responses: responses, retryAfter: retryAfter) }
    }

    /// Drops the answers still queued for `clientID` and its holds not yet reached.
    package func clearFailures(clientID: String) {
        let holds = state.withLock { state -> [FakeAppleHeldCall] in
            for endpoint in ["token", "revoke"] {
                state.failures[FakeAppleState.failureKey(endpoint, clientID)] = nil
            }
            let keys = ["token", "revoke"].map { FakeAppleState.failureKey($0, clientID) }
            defer { for key in keys { state.holds[key] = nil } }
            return keys.compactMap { state.holds[$0] }
        }
        for hold in holds where !hold.hasArrived { hold.release() }
    }

    /// Lets `calls` more calls to `endpoint` through, then parks every further one unanswered until
    /// `openGate(endpoint:)`: a long run (an export, an import) stopped at a known point.
    package func closeGate(endpoint: String, after calls: Int) {
        state.withLock { $0.gates[endpoint] = .init(remaining: calls) }
    }

    /// How many calls the gate of `endpoint` holds now.
    package func parkedCalls(endpoint: String) -> Int { state.withLock { $0.gates[endpoint]?.parked.count ?? 0 } }

    /// Answers every parked call (for real) and lets later ones through.
    package func openGate(endpoint: String) {
        let parked = state.withLock { $0.gates.removeValue(forKey: endpoint)?.parked ?? [] }
        for call in parked { call() }
    }

    /// Holds the next call of `clientID` to `endpoint` (`token` or `revoke`) until the returned
    /// hold is released: Apple answering slowly while other work goes on.
    package func holdNextCall(endpoint: String, clientID: String) -> FakeAppleHeldCall {
        let hold = FakeAppleHeldCall(key: FakeAppleState.failureKey(endpoint, clientID))
        state.withLock { $0.holds[hold.key] = hold }
        return hold
    }

    /// The user ended the grants of `(clientID, sub)` at Apple (withdrew consent in Settings, or
    /// deleted the Apple Account): every refresh token issued before `time` stops working.
    package func userEndedGrants(clientID: String, sub: String, issuedBefore time: Date) {
        state.withLock { $0.endGrants(clientID: clientID, sub: sub, issuedBefore: time, inclusive: false) }
    }

    /// Every refresh token issued or registered for `(clientID, sub)`, oldest first. TEST ONLY.
    package func issuedTokens(clientID: String, sub: String) -> [FakeAppleIssuedToken] {
        state.withLock { state in
            state.refreshTokens.filter { $0.value.clientID == clientID && $0.value.sub == sub }
                .map {
                    FakeAppleIssuedToken(
                        token: $0.key, code: $0.value.code, issuedAt: $0.value.issuedAt, dead: $0.value.revoked,
                        revokedByClient: $0.value.revokedByClient)
                }
                .sorted { $0.issuedAt < $1.issuedAt }
        }
    }

    package var calls: [FakeAppleCall] { state.withLock { $0.calls } }

    /// Whether a refresh token was revoked (nil: never issued or registered).
    package func isRevoked(refreshToken: String) -> Bool? { state.withLock { $0.refreshTokens[refreshToken]?.revoked } }

    /// How many authenticated revoke calls named this token (nil: never issued or registered).
    package func revokeCalls(refreshToken: String) -> Int? {
        state.withLock { $0.refreshTokens[refreshToken]?.revokeCalls }
    }

    /// The refresh tokens issued for `(clientID, sub)`. Tests use it to compare with what was stored.
    package func refreshTokens(clientID: String, sub: String) -> [String] {
        state.withLock { $0.refreshTokens.filter { $0.value.clientID == clientID && $0.value.sub == sub }.map(\.key) }
    }

    package var jsonWebKeySet: JSONWebKeySet {
        JSONWebKeySet(keys: [JSONWebKey(rs256: signingKey.publicKey, keyID: configuration.keyID)])
    }

    // MARK: Routing

    private func handle(_ request: HTTPRequest, respond: @escaping @Sendable (HTTPResponse) -> Void) {
        let route = (request.method, request.path)
        switch route {
        case ("GET", "/auth/keys"):
            answer(endpoint: "keys", clientID: nil, grantType: nil, respond: respond) { [self] in
                (.json(String(decoding: jsonWebKeySet.jsonBytes(), as: UTF8.self)), false)
            }
        case ("POST", "/auth/token"):
            let form = FormEncoding.decode(request.bodyText)
            answer(endpoint: "token", clientID: form["client_id"], grantType: form["grant_type"], form: form, respond: respond) { [self] in
                token(form)
            }
        case ("POST", "/auth/revoke"):
            let form = FormEncoding.decode(request.bodyText)
            answer(endpoint: "revoke", clientID: form["client_id"], grantType: nil, form: form, respond: respond) { [self] in
                revoke(form)
            }
        case ("POST", "/auth/usermigrationinfo"):
            let form = FormEncoding.decode(request.bodyText)
            let bearer = request.header("authorization")
            answer(endpoint: "usermigrationinfo", clientID: form["client_id"], grantType: nil, respond: respond) { [self] in
                userMigrationInfo(form, authorization: bearer)
            }
        case ("GET", "/auth/authorize"):
            respond(authorize(request.query))
        case ("GET", "/fake/signed-in"):
            respond(signedInPage(request.query))
        case ("POST", "/fake/authorize-user"):
            respond(adminAuthorizeUser(request))
        case ("POST", "/fake/codes"):
            respond(adminRegisterCode(request))
        case ("POST", "/fake/identity-tokens"):
            respond(adminIssueIdentityToken(request))
        case ("POST", "/fake/failures"):
            respond(adminInjectFailures(request))
        case ("GET", "/fake/calls"):
            respond(adminCalls())
        case ("GET", "/fake/signing-key"):
            respond(adminSigningKey())
        case (_, "/auth/keys"), (_, "/auth/token"), (_, "/auth/revoke"), (_, "/auth/usermigrationinfo"):
            respond(.json(status: 405, #"{"error":"method_not_allowed"}"#))
        default:
            respond(.json(status: 404, #"{"error":"not_found"}"#))
        }
    }

    /// Applies an injected failure if one is queued, else `body`; records the call either way. A held
    /// call waits for its release, which may name the answer.
    private func answer(
        endpoint: String, clientID: String?, grantType: String?, form: [String: String] = [:],
        respond: @escaping @Sendable (HTTPResponse) -> Void, _ body: @escaping @Sendable () -> (HTTPResponse, Bool)
    ) {
        let hold = state.withLock { state -> FakeAppleHeldCall? in
            guard let clientID else { return nil }
            return state.holds.removeValue(forKey: FakeAppleState.failureKey(endpoint, clientID))
        }
        let arrived = Date()
        let proceed: @Sendable (FakeAppleFailure?) -> Void = { [self] released in
            let injected = released.map { ($0, String?.none) } ?? state.withLock { $0.nextFailure(endpoint, clientID: clientID) }
            if case (.oauthError("invalid_grant"), _)? = injected { endGrant(named: form, arrived: arrived) }
            answer(injected, endpoint: endpoint, clientID: clientID, grantType: grantType, form: form, respond: respond, body)
        }
        if let hold, hold.arrive(proceed) { return }
        let parked = state.withLock { state -> Bool in
            guard var gate = state.gates[endpoint] else { return false }
            defer { state.gates[endpoint] = gate }
            if gate.remaining > 0 {
                gate.remaining -= 1
                return false
            }
            gate.parked.append { proceed(nil) }
            return true
        }
        if !parked { proceed(nil) }
    }

    private func answer(
        _ injected: (FakeAppleFailure, String?)?, endpoint: String, clientID: String?, grantType: String?,
        form: [String: String], respond: @escaping @Sendable (HTTPResponse) -> Void, _ body: () -> (HTTPResponse, Bool)
    ) {
        var response: HTTPResponse
        var validSecret = false
        switch injected {
        case nil:
            (response, validSecret) = body()
        case (.status(let status), let retryAfter)?:
            response = .json(status: status, "{}")
            if status == 429, let retryAfter { response.headers.append(("Retry-After", retryAfter)) }
        case (.oauthError(let error), _)?:
            response = Self.oauthError(error)
        case (.badSignature, _)?:
            (response, validSecret) = body()
            if response.status == 200 { response = resign(response) }
        case (.slow, _)?:
            (response, validSecret) = body()
            record(
                endpoint: endpoint, clientID: clientID, grantType: grantType, status: response.status,
                error: Self.errorCode(of: response), validSecret: validSecret)
            let delayed = response
            DispatchQueue.global().asyncAfter(deadline: .now() + configuration.hangDuration.seconds) { respond(delayed) }
            return
        case (.timeout, _)?:
            record(endpoint: endpoint, clientID: clientID, grantType: grantType, status: 0, error: "timeout", validSecret: false)
            let hang = configuration.hangDuration
            DispatchQueue.global().asyncAfter(deadline: .now() + hang.seconds) {
                respond(.json(status: 504, #"{"error":"timeout"}"#))
            }
            return
        }
        let error = Self.errorCode(of: response)
        record(endpoint: endpoint, clientID: clientID, grantType: grantType, status: response.status, error: error, validSecret: validSecret)
        respond(response)
    }

    /// An injected `invalid_grant` keeps the fake consistent: the code or token it names is dead.
    /// For a refresh token that is Apple's answer when the user ended the grant: every token of that
    /// user and client ID issued before the call arrived is dead (a token issued after it is not).
    private func endGrant(named form: [String: String], arrived: Date) {
        state.withLock { state in
            if let code = form["code"] { state.codes[code]?.used = true }
            guard let token = form["refresh_token"] ?? form["token"], let grant = state.refreshTokens[token] else { return }
            state.endGrants(clientID: grant.clientID, sub: grant.sub, issuedBefore: arrived, inclusive: true)
        }
    }

    private func record(endpoint: String, clientID: String?, grantType: String?, status: Int, error: String?, validSecret: Bool) {
        let call = FakeAppleCall(
            endpoint: endpoint, clientID: clientID, grantType: grantType, status: status, error: error,
            validClientSecret: validSecret, time: Date())
        state.withLock { $0.calls.append(call) }
        logger.debug(
            "fake apple call",
            metadata: ["fake.endpoint": .string(endpoint), "http.status": .int(status), "client_id": .string(clientID ?? "")])
    }

    static func errorCode(of response: HTTPResponse) -> String? {
        guard response.status >= 400,
            let object = try? JSONSerialization.jsonObject(with: Data(response.body)) as? [String: Any]
        else { return nil }
        return object["error"] as? String
    }

    static func oauthError(_ error: String, status: Int = 400) -> HTTPResponse {
        .json(status: status, "{\"error\":\"\(error)\"}")
    }

    static func randomHex(_ bytes: Int) -> String {
        // Not String(format:) per byte: that was a Foundation formatter, a string and a join per
        // byte, three times a sign-in, in the process the sign-in bench shares with every server.
        let digits = Array("0123456789abcdef".utf8)
        var text: [UInt8] = []
        text.reserveCapacity(2 * bytes)
        for byte in SecureRandom.bytes(count: bytes) {
            text.append(digits[Int(byte >> 4)])
            text.append(digits[Int(byte & 0x0f)])
        }
        return String(decoding: text, as: UTF8.self)
    }

    static func json(_ object: [String: Any], status: Int = 200) -> HTTPResponse {
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes])) ?? Data("{}".utf8)
        return .json(status: status, String(decoding: data, as: UTF8.self))
    }
}
