import AppleClient
import FakeApple
import Foundation
import AppAPI
import Settings
import Metrics

/// The app API of one model sequence, served in process on 127.0.0.1:0 over the world's Apple
/// context and pool. One per sequence that signs in: the API accepts identity tokens only for the
/// client IDs it serves, and each sequence has a client ID of its own.
final class ModelAppAPI: Sendable {
    static let token = "model-api-token-0123456789abcdefghijklmnop"

    let server: AppAPIServer
    let serving: Task<Void, any Error>
    let baseURL: String
    let fake: FakeApple
    let clientID: String
    let sub: String

    init(world: ModelWorld, clientID: String, sub: String) async throws {
        // Apple's answers can be held across many steps: bounds far above any hold, so only the
        // model's own release ends an exchange.
        let server = AppAPIServer(
            configuration: AppAPIConfiguration(listen: ListenAddress(host: "127.0.0.1", port: 0), tokens: [Self.token]),
            clientIDs: [clientID], apple: world.harness.context, pool: world.harness.pool, registry: MetricsRegistry(),
            logger: world.logger, appleTimeout: .seconds(120), databaseTimeout: .seconds(60))
        self.server = server
        self.clientID = clientID
        self.sub = sub
        fake = world.fake
        serving = try await server.runInBackground()
        baseURL = "http://127.0.0.1:\(server.port)"
    }

    func shutDown() async {
        serving.cancel()
        _ = try? await serving.value
    }

    /// What the device does before it calls the API: a nonce from the API, then Apple's identity
    /// token for the nonce's hash (and a fresh code, registered at the fake, when `withCode`).
    func prepare(withCode: Bool) async throws -> (body: [String: Any], code: String?) {
        let answer = try await post("/v1/nonces", body: nil)
        guard answer.status == 201, let nonce = answer.json["nonce"] as? String else {
            throw HarnessError(message: "POST /v1/nonces: \(answer.status) \(answer.body)")
        }
        let claim = IdentityTokenVerifier.nonceClaim(rawNonce: nonce)
        let email = "\(sub)@privaterelay.appleid.com"
        var body: [String: Any] = ["client_id": clientID, "nonce": nonce]
        guard withCode else {
            body["identity_token"] = fake.signIDToken(clientID: clientID, sub: sub, email: email, isPrivateEmail: true, nonce: claim)
            return (body, nil)
        }
        let apple = fake.issueIdentityToken(clientID: clientID, sub: sub, nonce: claim, email: email, isPrivateEmail: true)
        body["identity_token"] = apple.identityToken
        body["authorization_code"] = apple.authorizationCode
        return (body, apple.authorizationCode)
    }

    /// `POST /v1/sign-in`, described for the trace: "sign-in <status> <error or account status>".
    func signIn(_ body: [String: Any]) async throws -> String {
        try await signInAnswer(body).what
    }

    struct SignInAnswer: Sendable {
        var what: String
        var isNew: Bool?
        var appUserID: String?
    }

    /// As `signIn`, with the answer's `new` and `app_user_id`.
    func signInAnswer(_ body: [String: Any]) async throws -> SignInAnswer {
        let answer = try await post("/v1/sign-in", body: body)
        let detail = answer.error ?? (answer.json["status"] as? String) ?? answer.body
        return SignInAnswer(
            what: "sign-in \(answer.status) \(detail)", isNew: answer.json["new"] as? Bool,
            appUserID: answer.json["app_user_id"] as? String)
    }

    private func post(_ path: String, body: [String: Any]?) async throws -> AppAPIHarness.Answer {
        let json = try body.map { try JSONSerialization.data(withJSONObject: $0) }
        let (status, text) = try await HTTP.request("POST", baseURL + path, body: json, bearer: Self.token, timeout: .seconds(30))
        return AppAPIHarness.Answer(status: status, body: text)
    }
}

/// What a sign-in may answer, whatever else happened to the account: a sign-in is refused only
/// for a deletion (403) or for Apple's own answer to the exchange; never for anything else.
enum ModelSignInRule {
    static func accepted(_ what: String) -> Bool { what.hasPrefix("sign-in 200 ") }

    /// Nil when `what` is an answer the contract allows after Apple answered `answer`.
    static func violation(_ what: String, withCode: Bool, answer: AppleAnswer) -> String? {
        let parts = what.split(separator: " ", maxSplits: 2).map(String.init)
        guard parts.count == 3, parts[0] == "sign-in", let status = Int(parts[1]) else { return "unparsable: \(what)" }
        let detail = parts[2]
        switch status {
        case 200: return detail == "active" ? nil : "200 with status \(detail)"
        case 403: return detail == "account_deleting" ? nil : "403 \(detail)"
        case 400 where withCode && answer == .invalidGrant: return detail == "code_invalid" ? nil : "400 \(detail)"
        case 502 where withCode && [.unavailable, .timeout, .invalidClient].contains(answer):
            return detail == "token_exchange_failed" ? nil : "502 \(detail)"
        default: return "\(status) \(detail) (Apple answered \(answer))"
        }
    }
}
