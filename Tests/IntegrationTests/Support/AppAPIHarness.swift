import AppleClient
import CryptoCore
import FakeApple
import Foundation
import JOSE
import Logging
import Postgres
import AppAPI
import AppleJobs
import Settings
import Metrics
import TestTiming

/// The app API in process over a `LifecycleHarness` (migrated database, fake Apple checking our
/// client_secret): served on 127.0.0.1:0 with the handlers' own Apple context, logging at debug
/// level into a file the tests search for secrets.
final class AppAPIHarness: Sendable {
    static let token = "test-api-token-0123456789abcdefghijklmnop"
    static let otherClientID = "com.example.web"

    let lifecycle: LifecycleHarness
    let server: AppAPIServer
    let apiPool: PostgresPool
    let serving: Task<Void, any Error>
    let logPath: String
    let baseURL: String

    /// - Parameter appleTimeout: the production bound (5 s) where a test is about it; wider elsewhere,
    ///   so a loaded machine cannot turn the in-process fake's slowness into a 502.
    init(nonceLifetime: Duration = .seconds(300), appleTimeout: Duration = TestTimeScale.scaled(.seconds(20))) async throws {
        logPath = FileManager.default.temporaryDirectory.appendingPathComponent("app-api-\(UUID().uuidString).log").path
        _ = FileManager.default.createFile(atPath: logPath, contents: nil)
        let descriptor = open(logPath, O_WRONLY | O_APPEND)
        let logger = Logger(label: "app-api-test", level: .debug, sink: LogSink(fileDescriptor: descriptor))
        lifecycle = try await LifecycleHarness(logger: logger)
        // Every unknown kid refetches (no rate limit), so a test can count the refetches it causes.
        var context = lifecycle.context
        context.identityVerifier = IdentityTokenVerifier(
            keys: AppleKeySet(http: AppleHTTP(baseURL: lifecycle.fake.baseURL), logger: logger, minimumRefetchInterval: .zero))
        // The whole suite shares two loaded cores: database bounds wide enough that only a real hang trips them.
        apiPool = PostgresPool(conninfo: lifecycle.database.url, size: 8, acquireTimeout: .seconds(60), logger: logger)
        let configuration = AppAPIConfiguration(
            listen: ListenAddress(host: "127.0.0.1", port: 0), tokens: [Self.token, String(repeating: "b", count: 40)],
            nonceLifetime: nonceLifetime)
        let server = AppAPIServer(
            configuration: configuration, clientIDs: [LifecycleHarness.clientID, Self.otherClientID], apple: context,
            pool: apiPool, registry: MetricsRegistry(), logger: logger, appleTimeout: appleTimeout,
            databaseTimeout: .seconds(60))
        self.server = server
        serving = try await server.runInBackground()
        baseURL = "http://127.0.0.1:\(server.port)"
    }

    func shutDown() async {
        serving.cancel()
        _ = try? await serving.value
        apiPool.close()
        await lifecycle.shutDown()
        try? FileManager.default.removeItem(atPath: logPath)
    }

    var fake: FakeApple { lifecycle.fake }
    var connection: PostgresConnection { lifecycle.connection }
    var log: String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }

    // MARK: Requests

    struct Answer: Sendable {
        var status: Int
        var body: String
        var json: [String: Any] { ((try? JSONSerialization.jsonObject(with: Data(body.utf8))) as? [String: Any]) ?? [:] }
        var error: String? { json["error"] as? String }
    }

    func request(_ method: String, _ path: String, body: Any? = nil, rawBody: Data? = nil, bearer: String? = token)
        async throws -> Answer
    {
        let json = try rawBody ?? body.map { try JSONSerialization.data(withJSONObject: $0) }
        let (status, text) = try await HTTP.request(method, baseURL + path, body: json, bearer: bearer, timeout: TestTimeScale.scaled(.seconds(30)))
        return Answer(status: status, body: text)
    }

    func nonce() async throws -> String {
        let answer = try await request("POST", "/v1/nonces")
        guard answer.status == 201, let nonce = answer.json["nonce"] as? String else {
            throw HarnessError(message: "POST /v1/nonces: \(answer.status) \(answer.body)")
        }
        return nonce
    }

    /// What the device gets from Apple for `nonce` (the SHA-256 hex of the raw nonce, as an app sends it).
    func appleSignIn(sub: String, nonce: String, clientID: String = LifecycleHarness.clientID, email: String? = "u@privaterelay.appleid.com")
        -> (identityToken: String, authorizationCode: String)
    {
        fake.issueIdentityToken(
            clientID: clientID, sub: sub, nonce: IdentityTokenVerifier.nonceClaim(rawNonce: nonce), email: email,
            isPrivateEmail: email.map { $0.hasSuffix("privaterelay.appleid.com") })
    }

    func signIn(clientID: String = LifecycleHarness.clientID, identityToken: String, nonce: String, code: String?) async throws
        -> Answer
    {
        var body: [String: Any] = ["client_id": clientID, "identity_token": identityToken, "nonce": nonce]
        if let code { body["authorization_code"] = code }
        return try await request("POST", "/v1/sign-in", body: body)
    }

    /// The whole flow for `sub`: nonce, Apple, sign-in with the code.
    func signIn(sub: String, withCode: Bool = true) async throws -> Answer {
        let nonce = try await nonce()
        let apple = appleSignIn(sub: sub, nonce: nonce)
        return try await signIn(identityToken: apple.identityToken, nonce: nonce, code: withCode ? apple.authorizationCode : nil)
    }

    /// `signIn(sub:)` that must answer 200 (the test fails with the answer otherwise).
    @discardableResult
    func signedIn(sub: String) async throws -> Answer {
        let answer = try await signIn(sub: sub)
        guard answer.status == 200 else { throw HarnessError(message: "sign-in of \(sub): \(answer.status) \(answer.body)") }
        return answer
    }

    /// A token signed with the fake's key (or `key`) with these claims, as Apple's would be.
    func token(_ claims: [String: Any], keyID: String? = nil, key: RSA.PrivateKey? = nil) throws -> String {
        let payload = try JSONSerialization.data(withJSONObject: claims, options: [.sortedKeys, .withoutEscapingSlashes])
        return try JWTSigner.rs256(payload: Array(payload), keyID: keyID ?? fake.configuration.keyID, privateKey: key ?? fake.signingKey)
    }

    /// Claims of a valid identity token for `sub` and `nonce`.
    func claims(sub: String, nonce: String, clientID: String = LifecycleHarness.clientID) -> [String: Any] {
        let now = Int(Date().timeIntervalSince1970)
        return [
            "iss": "https://appleid.apple.com", "aud": clientID, "sub": sub, "iat": now, "exp": now + 600,
            "nonce": IdentityTokenVerifier.nonceClaim(rawNonce: nonce), "email": "u@example.com", "email_verified": "true",
        ]
    }

    func keyFetches() -> Int { fake.calls.filter { $0.endpoint == "keys" }.count }
}

/// Runs `body` with a fresh app API and shuts it down afterwards.
func withAppAPI<T>(appleTimeout: Duration = TestTimeScale.scaled(.seconds(20)), _ body: (AppAPIHarness) async throws -> T) async throws -> T {
    let harness = try await AppAPIHarness(appleTimeout: appleTimeout)
    do {
        let value = try await body(harness)
        await harness.shutDown()
        return value
    } catch {
        await harness.shutDown()
        throw error
    }
}

extension AppAPIServer {
    /// Runs the server in a task of its own, returned once the server listens (bounded; the task is
    /// cancelled if it never does).
    func runInBackground() async throws -> Task<Void, any Error> {
        let serving = Task { try await run() }
        do {
            try await waitUntil("the app API listens", timeout: .seconds(20), every: .milliseconds(5)) { port != 0 }
        } catch {
            serving.cancel()
            throw error
        }
        return serving
    }
}
