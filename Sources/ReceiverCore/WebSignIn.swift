import AppleClient
import CryptoCore
package import Foundation
package import HTTPServer
package import Logging
package import Metrics
package import Postgres

/// The browser side of Sign in with Apple for websites and Android apps
/// (deploy/web-sign-in.md), on the receiver's listener when `SIWA_PUBLIC_URL` is set:
/// - `GET /apple/sign-in?client_id&return_to[&scope][&app_state]` keeps a state (and the raw
///   nonce whose SHA-256 goes to Apple) in the database, then 302 to Apple's `/auth/authorize`;
/// - `POST /apple/sign-in/callback` takes Apple's `form_post`, spends the state and, for an
///   answer with an identity token, stores a one-time ticket; then 303 to the state's return URL
///   with `siwa_ticket` or `siwa_error` (and `siwa_app_state`) added to its query.
/// No cookie: the state is the database's. The receiver holds no secret and checks nothing of the
/// identity token: the app API does, when the ticket is redeemed. No code, identity token, ticket
/// or state reaches a log line.
package struct WebSignIn: Sendable {
    package static let startPath = "/apple/sign-in"
    package static let callbackPath = "/apple/sign-in/callback"
    /// Largest callback body read (Apple's is about 2 KB: an identity token, a code, a name).
    static let maximumCallbackBytes = 16 * 1024
    static let maximumAppStateLength = 512

    let settings: WebSignInSettings
    /// The receiver's bound port, read per sign-in; nil unless the public URL names port 0.
    private let listeningPort: (@Sendable () -> Int)?
    let clientIDs: Set<String>
    let appleBaseURL: URL
    let pool: PostgresPool
    let timeout: Duration
    let logger: Logger
    let outcomes: [String: Counter]

    package init(
        settings: WebSignInSettings, listeningPort: @escaping @Sendable () -> Int, clientIDs: [String], appleBaseURL: URL,
        pool: PostgresPool, timeout: Duration, metrics: MetricsRegistry, logger: Logger
    ) {
        self.settings = settings
        self.listeningPort = settings.followsListeningPort ? listeningPort : nil
        self.clientIDs = Set(clientIDs)
        self.appleBaseURL = appleBaseURL
        self.pool = pool
        self.timeout = timeout
        self.logger = logger
        var outcomes: [String: Counter] = [:]
        for (step, outcome) in [
            ("start", "redirected"), ("start", "refused"), ("start", "too_many"), ("start", "failed"),
            ("callback", "ticket"), ("callback", "error"), ("callback", "state_invalid"), ("callback", "refused"),
            ("callback", "failed"),
        ] {
            outcomes["\(step) \(outcome)"] = metrics.counter(
                "siwa_receiver_web_sign_in_total", help: "Web sign-in requests, by step and outcome.",
                labels: ["step": step, "outcome": outcome])
        }
        self.outcomes = outcomes
    }

    /// Apple's redirect URI, with the public URL's port 0 replaced by the one the receiver bound.
    /// Only it names the port; the URL is parsed once, at start, to know whether it follows.
    var redirectURI: String {
        guard let listeningPort else { return settings.redirectURI }
        return settings.resolved(listeningPort: listeningPort()).redirectURI
    }

    /// Takes the request when its path is one of this flow's; false otherwise.
    package func handle(_ request: HTTPRequest, respond: @escaping @Sendable (HTTPResponse) -> Void) -> Bool {
        switch (request.method, request.path) {
        case ("GET", Self.startPath):
            Task { [self] in respond(await start(request.query)) }
        case ("POST", Self.callbackPath):
            Task { [self] in respond(await callback(request)) }
        case (_, Self.startPath):
            respond(Self.error(405, "method_not_allowed", headers: [("Allow", "GET")]))
        case (_, Self.callbackPath):
            respond(Self.error(405, "method_not_allowed", headers: [("Allow", "POST")]))
        default:
            return false
        }
        return true
    }

    // MARK: GET /apple/sign-in

    func start(_ query: [String: String]) async -> HTTPResponse {
        guard let clientID = query["client_id"], clientIDs.contains(clientID) else {
            return refuse("start", 400, "client_id_unknown")
        }
        guard let returnTo = query["return_to"], settings.returnURLs.contains(returnTo) else {
            return refuse("start", 400, "return_to_not_allowed")
        }
        let scope = query["scope"] ?? "name email"
        guard scope.split(separator: " ").allSatisfy({ $0 == "name" || $0 == "email" }) else {
            return refuse("start", 400, "scope_invalid")
        }
        let appState = query["app_state"]
        if let appState, appState.unicodeScalars.count > Self.maximumAppStateLength || appState.unicodeScalars.contains("\u{0}") {
            return refuse("start", 400, "app_state_invalid")
        }
        let redirectURI = self.redirectURI  // once: the port is read under a lock
        let state = Base64URL.encode(SecureRandom.bytes(count: 32))
        let nonce = Base64URL.encode(SecureRandom.bytes(count: 32))
        let kept: Bool
        do {
            kept = try await run { connection in
                try await connection.query(
                    """
                    SELECT siwa.begin_web_sign_in(\(SHA256.hash(Array(state.utf8))), \(clientID), \(returnTo), \(appState),
                                                  \(nonce), \(redirectURI), \(Int32(settings.maxPending)))
                    """
                )[0].decode(Bool.self, at: 0)
            }
        } catch {
            outcomes["start failed"]?.increment()
            logger.warning("web sign-in: could not keep a state", metadata: ["error": "\(error)"])
            return Self.error(503, "database_unavailable")
        }
        guard kept else {
            outcomes["start too_many"]?.increment()
            logger.warning("web sign-in: too many unspent states", metadata: ["web_sign_in.max_pending": .int(settings.maxPending)])
            return Self.error(429, "too_many_sign_ins", headers: [("Retry-After", "60")])
        }
        outcomes["start redirected"]?.increment()
        logger.debug("web sign-in started", metadata: ["client_id": .string(clientID)])
        let fields = [
            ("response_type", "code id_token"), ("response_mode", "form_post"), ("client_id", clientID),
            ("redirect_uri", redirectURI), ("scope", scope), ("state", state),
            ("nonce", IdentityTokenVerifier.nonceClaim(rawNonce: nonce)),
        ]
        let authorize = appleBaseURL.absoluteString + "/auth/authorize?" + FormEncoding.encode(fields)
        return Self.redirect(302, to: authorize)
    }

    // MARK: POST /apple/sign-in/callback

    func callback(_ request: HTTPRequest) async -> HTTPResponse {
        guard request.body.count <= Self.maximumCallbackBytes else { return refuse("callback", 413, "payload_too_large") }
        guard request.header("content-type")?.lowercased().hasPrefix("application/x-www-form-urlencoded") == true else {
            return refuse("callback", 400, "bad_request")
        }
        let form = FormEncoding.decode(request.bodyText)
        guard let state = form["state"], !state.isEmpty, state.utf8.count <= 256 else {
            return refuse("callback", 400, "state_invalid")
        }
        var ticket: String?
        var failure: String?
        var identityToken: String?
        var code: String?
        if let appleError = form["error"] {
            failure = Self.errorCode(appleError)
        } else if let token = form["id_token"], !token.isEmpty, token.utf8.count <= 8 * 1024, !token.unicodeScalars.contains("\u{0}") {
            identityToken = token
            code = form["code"].flatMap { $0.isEmpty || $0.utf8.count > 2048 || $0.unicodeScalars.contains("\u{0}") ? nil : $0 }
            ticket = Base64URL.encode(SecureRandom.bytes(count: 32))
        } else {
            failure = "invalid_response"
        }
        let fullName = Self.fullName(fromUser: form["user"])
        let finished: (valid: Bool, returnTo: String?, appState: String?, ticketStored: Bool)
        do {
            finished = try await run { [ticket, identityToken, code] connection in
                let row = try await connection.query(
                    """
                    SELECT valid, return_to, app_state, ticket_stored
                      FROM siwa.finish_web_sign_in(\(SHA256.hash(Array(state.utf8))), \(ticket.map { SHA256.hash(Array($0.utf8)) }),
                                                   \(identityToken), \(code), \(fullName)::jsonb, \(Int32(settings.maxPending)))
                    """)[0]
                return (
                    try row.decode(Bool.self, column: "valid"), try row.decode(String?.self, column: "return_to"),
                    try row.decode(String?.self, column: "app_state"), try row.decode(Bool.self, column: "ticket_stored")
                )
            }
        } catch {
            outcomes["callback failed"]?.increment()
            logger.warning("web sign-in: could not finish a callback", metadata: ["error": "\(error)"])
            return Self.error(503, "database_unavailable")
        }
        guard finished.valid, let returnTo = finished.returnTo else { return refuse("callback", 400, "state_invalid") }
        if ticket != nil && !finished.ticketStored {
            logger.warning("web sign-in: too many unspent tickets", metadata: ["web_sign_in.max_pending": .int(settings.maxPending)])
            (ticket, failure) = (nil, "too_many_sign_ins")
        }
        var parameters: [(String, String)] = []
        if let ticket { parameters.append(("siwa_ticket", ticket)) }
        if let failure { parameters.append(("siwa_error", failure)) }
        if let appState = finished.appState { parameters.append(("siwa_app_state", appState)) }
        outcomes[ticket != nil ? "callback ticket" : "callback error"]?.increment()
        logger.debug("web sign-in returned", metadata: ["web_sign_in.outcome": .string(failure ?? "ticket")])
        return Self.redirect(303, to: Self.adding(parameters, to: returnTo))
    }

    // MARK: Pieces

    /// `body` on a pooled connection, each statement bounded by `timeout`.
    private func run<T: Sendable>(_ body: @escaping @Sendable (PostgresConnection) async throws -> T) async throws -> T {
        try await PostgresConnection.$statementTimeout.withValue(timeout) {
            try await pool.withConnection { try await body($0) }
        }
    }

    private func refuse(_ step: String, _ status: Int, _ code: String) -> HTTPResponse {
        outcomes["\(step) refused"]?.increment()
        logger.debug("web sign-in refused", metadata: ["web_sign_in.step": .string(step), "reason": .string(code)])
        return Self.error(status, code)
    }

    static func error(_ status: Int, _ code: String, headers: [(name: String, value: String)] = []) -> HTTPResponse {
        var response = HTTPResponse.json(status: status, #"{"error":"\#(code)"}"#)
        response.headers += headers + [("Cache-Control", "no-store")]
        return response
    }

    static func redirect(_ status: Int, to location: String) -> HTTPResponse {
        HTTPResponse(
            status: status,
            headers: [
                ("Location", location), ("Cache-Control", "no-store"), ("Referrer-Policy", "no-referrer"),
                ("Content-Type", "text/plain; charset=utf-8"),
            ])
    }

    /// Apple's `error` as a code we pass on: letters, digits and `_` only, at most 64; else
    /// `authorization_failed` (a return URL never carries text an attacker chose).
    package static func errorCode(_ text: String) -> String {
        let allowed = !text.isEmpty && text.utf8.count <= 64
            && text.unicodeScalars.allSatisfy { ("a"..."z").contains($0) || ("0"..."9").contains($0) || $0 == "_" }
        return allowed ? text : "authorization_failed"
    }

    /// The name from Apple's `user` field (`{"name":{"firstName","lastName"},"email"}`, first
    /// authorization only) as the app API's `full_name` JSON; nil when there is none.
    package static func fullName(fromUser text: String?) -> String? {
        guard let text, let object = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any],
            let name = object["name"] as? [String: Any]
        else { return nil }
        var members: [String: String] = [:]
        for (from, to) in [("firstName", "given_name"), ("lastName", "family_name"), ("middleName", "middle_name")] {
            guard let part = name[from] as? String, !part.isEmpty, part.unicodeScalars.count <= 256,
                !part.unicodeScalars.contains("\u{0}")
            else { continue }
            members[to] = part
        }
        guard !members.isEmpty, let data = try? JSONSerialization.data(withJSONObject: members, options: [.sortedKeys]) else {
            return nil
        }
        return String(decoding: data, as: UTF8.self)
    }

    /// `url` with `parameters` added to its query, before any fragment.
    package static func adding(_ parameters: [(String, String)], to url: String) -> String {
        guard !parameters.isEmpty else { return url }
        var base = Substring(url)
        var fragment: Substring = ""
        if let hash = url.firstIndex(of: "#") {
            base = url[..<hash]
            fragment = url[hash...]
        }
        let separator = !base.contains("?") ? "?" : (base.hasSuffix("?") || base.hasSuffix("&") ? "" : "&")
        return base + separator + FormEncoding.encode(parameters) + fragment
    }
}
