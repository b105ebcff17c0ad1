import AppleClient
import CryptoCore
import FakeApple
import Foundation
import OutboundHTTP
import Postgres
import TestTiming

/// The web sign-in's two halves over one database: a real `siwa-receiver` serving
/// `/apple/sign-in` (on port 0, its SIWA_PUBLIC_URL naming port 0 too: the port it binds; the fake
/// Apple as Apple), and the app API in process (`AppAPIHarness`) redeeming tickets. The test plays
/// the browser (or drives one).
final class WebSignInStack: Sendable {
    static let returnURL = "https://app.example.com/signed-in"
    static let appReturnURL = "com.example.app:/signed-in#web"

    let api: AppAPIHarness
    let receiver: ServiceProcess
    /// The receiver's URL, with the port it bound.
    let base: String

    init(maxPending: Int? = nil) async throws {
        api = try await AppAPIHarness()
        var environment = [
            "DATABASE_URL": api.lifecycle.database.url,
            "SIWA_CLIENT_IDS": "\(LifecycleHarness.clientID),\(AppAPIHarness.otherClientID)",
            "SIWA_LISTEN": "127.0.0.1:0", "SIWA_APPLE_BASE_URL": api.fake.baseURL.absoluteString,
            "SIWA_LOG_LEVEL": "debug", "SIWA_PUBLIC_URL": "http://127.0.0.1:0",
            "SIWA_WEB_RETURN_URLS": "\(Self.returnURL),\(Self.appReturnURL),\(api.fake.baseURL.absoluteString)/fake/signed-in",
        ]
        if let maxPending { environment["SIWA_WEB_SIGN_IN_MAX_PENDING"] = String(maxPending) }
        var started: ServiceProcess?
        do {
            let process = try ServiceProcess("siwa-receiver", environment: environment)
            started = process
            let base = "http://127.0.0.1:\(try await process.boundHTTPPort())"
            try await ReceiverUnderTest.waitForReadiness(base, 200, receiver: process)
            (receiver, self.base) = (process, base)
        } catch {
            await started?.stop()
            await api.shutDown()
            throw error
        }
    }

    func shutDown() async {
        await receiver.stop()
        await api.shutDown()
    }

    var redirectURI: String { base + "/apple/sign-in/callback" }

    struct Answer: Sendable {
        var status: Int
        var location: String?
        var body: String
    }

    /// One request, redirects not followed.
    func send(_ method: String, _ url: String, form: [(String, String)]? = nil, contentType: String? = nil) async throws -> Answer {
        var headers: [(String, String)] = []
        if form != nil { headers.append(("Content-Type", contentType ?? "application/x-www-form-urlencoded")) }
        let body = form.map { Array(Self.encode($0).utf8) } ?? []
        let response = try await HTTP.client.send(
            HTTPRequest(method: method, url: url, headers: headers, body: body, timeout: TestTimeScale.scaled(.seconds(30))))
        return Answer(status: response.status, location: response.headers["location"], body: String(decoding: response.body, as: UTF8.self))
    }

    /// `GET /apple/sign-in` with these query items.
    func start(_ items: [(String, String)]) async throws -> Answer {
        try await send("GET", base + "/apple/sign-in?" + Self.encode(items))
    }

    /// The start with a good client ID and return URL; the query Apple's authorize page would get.
    func started(returnTo: String = returnURL, appState: String? = "session-42", clientID: String = LifecycleHarness.clientID)
        async throws -> [String: String]
    {
        var items = [("client_id", clientID), ("return_to", returnTo)]
        if let appState { items.append(("app_state", appState)) }
        let answer = try await start(items)
        guard answer.status == 302, let location = answer.location else {
            throw HarnessError(message: "GET /apple/sign-in: \(answer.status) \(answer.body)")
        }
        return Self.query(of: location)
    }

    /// What Apple posts back for `authorize` (the start's query): an identity token for `sub` with
    /// the start's nonce and a code bound to its redirect URI, and `user` with the name.
    func appleAnswer(_ authorize: [String: String], sub: String, firstName: String? = "Jane", lastName: String? = "Appleseed")
        -> [(String, String)]
    {
        let issued = api.fake.issueIdentityToken(
            clientID: authorize["client_id"] ?? "", sub: sub, nonce: authorize["nonce"] ?? "", email: "jane@privaterelay.appleid.com",
            isPrivateEmail: true, redirectURI: authorize["redirect_uri"])
        var form = [("state", authorize["state"] ?? ""), ("code", issued.authorizationCode), ("id_token", issued.identityToken)]
        if firstName != nil || lastName != nil {
            var name: [String: String] = [:]
            name["firstName"] = firstName
            name["lastName"] = lastName
            let user = try? JSONSerialization.data(withJSONObject: ["name": name, "email": "jane@privaterelay.appleid.com"])
            form.append(("user", String(decoding: user ?? Data(), as: UTF8.self)))
        }
        return form
    }

    func callback(_ form: [(String, String)]) async throws -> Answer {
        try await send("POST", redirectURI, form: form)
    }

    /// The whole browser side for `sub`: start, Apple, callback; the return URL's query.
    func ticket(sub: String, returnTo: String = returnURL) async throws -> [String: String] {
        let authorize = try await started(returnTo: returnTo)
        let answer = try await callback(appleAnswer(authorize, sub: sub))
        guard answer.status == 303, let location = answer.location else {
            throw HarnessError(message: "callback: \(answer.status) \(answer.body)")
        }
        return Self.query(of: location)
    }

    func redeem(_ ticket: String) async throws -> AppAPIHarness.Answer {
        try await api.redeemTicket(ticket)
    }

    static func query(of url: String) -> [String: String] {
        var items: [String: String] = [:]
        for item in URLComponents(string: url)?.queryItems ?? [] { items[item.name] = item.value ?? "" }
        return items
    }

    static func encode(_ items: [(String, String)]) -> String {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~")
        return items.map { "\($0.0)=\($0.1.addingPercentEncoding(withAllowedCharacters: allowed) ?? "")" }.joined(separator: "&")
    }
}

/// A web sign-in's ticket made without a receiver: what `GET /apple/sign-in` and its callback store
/// (`siwa.begin_web_sign_in`, then `siwa.finish_web_sign_in` with Apple's answer from the fake: an
/// identity token for the state's nonce, a code bound to `redirectURI`). Redeem it with
/// `POST /v1/sign-in {"ticket"}`. For model steps and races.
enum WebTicket {
    static let redirectURI = "https://auth.example.com/apple/sign-in/callback"

    static func make(
        connection: PostgresConnection, fake: FakeApple, sub: String, clientID: String, withCode: Bool = true,
        redirectURI: String = redirectURI, fullName: String? = #"{"given_name":"Jane"}"#
    ) async throws -> (ticket: String, code: String) {
        let state = Base64URL.encode(SecureRandom.bytes(count: 32))
        let nonce = Base64URL.encode(SecureRandom.bytes(count: 32))
        let ticket = Base64URL.encode(SecureRandom.bytes(count: 32))
        let kept = try await connection.query(
            """
            SELECT siwa.begin_web_sign_in(\(SHA256.hash(Array(state.utf8))), \(clientID), 'https://app.example.com/signed-in', NULL,
                                          \(nonce), \(redirectURI), 1000000)
            """)[0].decode(Bool.self, at: 0)
        let apple = fake.issueIdentityToken(
            clientID: clientID, sub: sub, nonce: IdentityTokenVerifier.nonceClaim(rawNonce: nonce), email: "u@privaterelay.appleid.com",
            isPrivateEmail: true, redirectURI: redirectURI)
        let code: String? = withCode ? apple.authorizationCode : nil
        let stored = try await connection.query(
            """
            SELECT ticket_stored FROM siwa.finish_web_sign_in(\(SHA256.hash(Array(state.utf8))), \(SHA256.hash(Array(ticket.utf8))),
                                                              \(apple.identityToken), \(code), \(fullName)::jsonb, 1000000)
            """)[0].decode(Bool.self, at: 0)
        guard kept, stored else { throw HarnessError(message: "web ticket for \(sub): state kept \(kept), ticket stored \(stored)") }
        return (ticket, apple.authorizationCode)
    }
}

extension AppAPIHarness {
    /// A web sign-in's ticket for `sub` (`WebTicket.make` over this harness's database and fake).
    func webTicket(
        sub: String, clientID: String = LifecycleHarness.clientID, withCode: Bool = true,
        redirectURI: String = WebTicket.redirectURI, fullName: String? = #"{"given_name":"Jane"}"#
    ) async throws -> String {
        try await WebTicket.make(
            connection: connection, fake: fake, sub: sub, clientID: clientID, withCode: withCode, redirectURI: redirectURI,
            fullName: fullName
        ).ticket
    }

    /// `POST /v1/sign-in {"ticket"}`.
    func redeemTicket(_ ticket: String) async throws -> Answer {
        try await request("POST", "/v1/sign-in", body: ["ticket": ticket])
    }
}
