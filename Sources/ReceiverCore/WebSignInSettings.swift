package import Settings
import Foundation

/// `SIWA_PUBLIC_URL`, `SIWA_WEB_RETURN_URLS` and the bound on unspent states and tickets
/// (deploy/web-sign-in.md); nil when `SIWA_PUBLIC_URL` is unset.
package struct WebSignInSettings: Sendable {
    /// Without a trailing `/`.
    package var publicURL: String
    /// Compared byte for byte with a request's `return_to`.
    package var returnURLs: [String]
    package var maxPending: Int

    /// What Apple posts to, and what the Services ID must list.
    package var redirectURI: String { publicURL + WebSignIn.callbackPath }

    /// The public URL names port 0 (`http://127.0.0.1:0`): the receiver's own port, known once it
    /// has bound `SIWA_LISTEN`. A receiver on loopback is its own public URL (`siwa dev`, tests), and
    /// a port chosen before binding could be taken by another process in between.
    package var followsListeningPort: Bool { URLComponents(string: publicURL)?.port == 0 }

    /// These settings with the public URL's port 0 replaced by `port`.
    package func resolved(listeningPort port: Int) -> WebSignInSettings {
        guard followsListeningPort, let colon = publicURL.lastIndex(of: ":") else { return self }
        var resolved = self
        resolved.publicURL = String(publicURL[..<colon]) + ":\(port)"
        return resolved
    }

    package init(publicURL: String, returnURLs: [String], maxPending: Int = 10_000) {
        self.publicURL = publicURL
        self.returnURLs = returnURLs
        self.maxPending = maxPending
    }

    package static func read(_ source: ConfigurationSource) throws(ConfigurationError) -> WebSignInSettings? {
        guard let text = try source.string("SIWA_PUBLIC_URL") else {
            if try source.string("SIWA_WEB_RETURN_URLS") != nil {
                throw ConfigurationError(variable: "SIWA_PUBLIC_URL", problem: "required with SIWA_WEB_RETURN_URLS")
            }
            return nil
        }
        let trimmed = text.hasSuffix("/") ? String(text.dropLast()) : text
        if let problem = problem(publicURL: trimmed) {
            throw ConfigurationError(variable: "SIWA_PUBLIC_URL", problem: "\(problem), got \"\(text)\"")
        }
        guard let returnURLs = try source.list("SIWA_WEB_RETURN_URLS") else {
            throw ConfigurationError(variable: "SIWA_WEB_RETURN_URLS", problem: "required with SIWA_PUBLIC_URL")
        }
        for url in returnURLs {
            if let problem = problem(returnURL: url) {
                throw ConfigurationError(variable: "SIWA_WEB_RETURN_URLS", problem: "\"\(url)\" \(problem)")
            }
        }
        let maxPending = try source.integer("SIWA_WEB_SIGN_IN_MAX_PENDING", default: 10_000, range: 1...1_000_000)
        return WebSignInSettings(publicURL: trimmed, returnURLs: returnURLs, maxPending: maxPending)
    }

    /// Why `text` cannot be the public base URL; nil when it can.
    static func problem(publicURL text: String) -> String? {
        guard let components = URLComponents(string: text), let scheme = components.scheme?.lowercased(),
            let host = components.host, !host.isEmpty
        else { return "expected an https:// URL" }
        guard scheme == "https" || (scheme == "http" && CommonSettings.isLoopback(host)) else {
            return "expected https://, or http:// only to a loopback address (127.0.0.1, ::1, localhost)"
        }
        guard components.path.isEmpty, components.query == nil, components.fragment == nil, components.user == nil,
            components.password == nil
        else { return "expected a scheme, a host and a port only (no path, query, fragment or user)" }
        if components.port == 0 && scheme != "http" {
            return "port 0 (the receiver's own port, once bound) only with http:// to a loopback address"
        }
        return nil
    }

    /// Schemes never allowed as a return URL: they run or read something instead of going somewhere.
    static let forbiddenSchemes: Set<String> = ["javascript", "data", "file", "vbscript", "blob", "about", "filesystem"]

    /// Why `text` cannot be a return URL; nil when it can: `https://` with a host, `http://` to a
    /// loopback host, or an app's own scheme (`com.example.app:/done`, `myapp://done`).
    package static func problem(returnURL text: String) -> String? {
        guard text.unicodeScalars.allSatisfy({ $0.value > 0x20 && $0.value < 0x7f }) else {
            return "holds a space, a control or a non-ASCII character"
        }
        guard let colon = text.firstIndex(of: ":") else { return "has no scheme" }
        let scheme = text[..<colon].lowercased()
        guard let first = scheme.unicodeScalars.first, ("a"..."z").contains(first),
            scheme.unicodeScalars.allSatisfy({ ("a"..."z").contains($0) || ("0"..."9").contains($0) || "+-.".unicodeScalars.contains($0) })
        else { return "has no valid scheme" }
        if forbiddenSchemes.contains(scheme) { return "uses the \(scheme): scheme, which is never allowed" }
        guard let components = URLComponents(string: text) else { return "is not a URL" }
        switch scheme {
        case "https":
            guard let host = components.host, !host.isEmpty else { return "has no host" }
        case "http":
            guard let host = components.host, CommonSettings.isLoopback(host) else {
                return "uses http://, allowed only to a loopback address (127.0.0.1, ::1, localhost)"
            }
        default:
            break
        }
        return nil
    }
}
