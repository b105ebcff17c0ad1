import CryptoCore
import Foundation
import Locking

/// The console's browser sessions, in memory: a random id in an `HttpOnly`, `SameSite=Strict`
/// cookie, and for each session an anti-forgery token that every POST must carry. A restart
/// forgets them all (a login again, a reloaded page), which is all a console needs.
final class ConsoleSessions: Sendable {
    static let cookieName = "siwa_console"
    /// A session not used for this long is forgotten.
    static let idleLifetime: TimeInterval = 12 * 3600
    /// Sessions kept at most; the least recently used goes first.
    static let capacity = 1000

    /// Keys the anti-forgery tokens: a token is an HMAC of its session's id, so a page can carry
    /// it without the server storing a second secret per session.
    private let formKey = SecureRandom.bytes(count: 32)
    private let tokens: [[UInt8]]
    /// Listening off loopback, the console is reached through a TLS proxy: its cookies carry
    /// `Secure`, so a browser never sends one over plain HTTP (deploy/README.md, "The operator console").
    private let secureCookies: Bool
    /// Session id → last use.
    private let sessions = Locked<[String: Date]>([:])

    /// `tokens` empty: no login (loopback), any browser gets a session on its first page.
    init(tokens: [String], secureCookies: Bool) {
        self.tokens = tokens.map { Array($0.utf8) }
        self.secureCookies = secureCookies
    }

    var requiresLogin: Bool { !tokens.isEmpty }

    /// The session the request's cookie names, if the server knows it (and it has not expired).
    func session(cookieHeader: String?) -> String? {
        guard let id = Self.cookieValue(cookieHeader) else { return nil }
        return sessions.withLock { sessions in
            guard let lastUse = sessions[id], Date().timeIntervalSince(lastUse) < Self.idleLifetime else {
                sessions[id] = nil
                return nil
            }
            sessions[id] = Date()
            return id
        }
    }

    /// A new session; returns its id.
    func open() -> String {
        let id = Base64URL.encode(SecureRandom.bytes(count: 32))
        sessions.withLock { sessions in
            if sessions.count >= Self.capacity, let oldest = sessions.min(by: { $0.value < $1.value })?.key {
                sessions[oldest] = nil
            }
            sessions[id] = Date()
        }
        return id
    }

    func close(_ id: String) {
        sessions.withLock { $0[id] = nil }
    }

    /// True when `candidate` is one of `SIWA_CONSOLE_TOKENS` (compared in constant time).
    func acceptsLogin(_ candidate: String) -> Bool {
        let bytes = Array(candidate.utf8)
        var accepted = false
        for token in tokens where ConstantTime.equals(token, bytes) { accepted = true }
        return accepted
    }

    /// The anti-forgery token of a session, for the hidden field of each form.
    func formToken(for session: String) -> String {
        Base64URL.encode(HMACSHA256.authenticationCode(for: Array("form:\(session)".utf8), key: formKey))
    }

    func isValidFormToken(_ token: String?, for session: String) -> Bool {
        guard let token else { return false }
        return ConstantTime.equals(Array(token.utf8), Array(formToken(for: session).utf8))
    }

    /// `Set-Cookie` for a session: not readable by scripts, never sent by another site's request.
    func cookie(_ id: String) -> String {
        "\(Self.cookieName)=\(id); Path=/; HttpOnly; SameSite=Strict" + (secureCookies ? "; Secure" : "")
    }

    /// `Set-Cookie` that ends the session in the browser.
    var expiredCookie: String { cookie("") + "; Max-Age=0" }

    static func cookieValue(_ header: String?) -> String? {
        guard let header else { return nil }
        for part in header.split(separator: ";") {
            let pair = part.trimmingCharacters(in: .whitespaces).split(separator: "=", maxSplits: 1)
            if pair.count == 2, pair[0] == cookieName, !pair[1].isEmpty { return String(pair[1]) }
        }
        return nil
    }
}
