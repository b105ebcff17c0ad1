package import Foundation
package import Settings

/// The webhook part of `siwa-worker`'s configuration (README.md, "Webhooks to the app"):
/// `SIWA_WEBHOOK_URL` + `SIWA_WEBHOOK_SECRET`, both or neither.
package struct WebhookSettings: Sendable {
    package static let variables = ["SIWA_WEBHOOK_URL", "SIWA_WEBHOOK_SECRET", "SIWA_WEBHOOK_CONCURRENCY"]

    package var url: URL
    package var secret: WebhookSecret
    /// `SIWA_WEBHOOK_CONCURRENCY`: deliveries in flight per worker process (each to another account).
    package var concurrency: Int
    /// A 2xx within this is delivered (the contract's 10 s; shorter only in tests).
    package var timeout: Duration
    /// Failed deliveries are retried for at least this long after their first failure, then discarded
    /// (the contract's "at least 24 h"; shorter only in tests).
    package var retryWindow: Duration
    /// `SIWA_CA_FILE`: certificates trusted for `https://` endpoints besides the system's.
    package var caCertificates: String?

    package init(
        url: URL, secret: WebhookSecret, concurrency: Int = 32, timeout: Duration = .seconds(10),
        retryWindow: Duration = .seconds(86_400)
    ) {
        self.url = url
        self.secret = secret
        self.concurrency = concurrency
        self.timeout = timeout
        self.retryWindow = retryWindow
    }

    /// nil when neither variable is set (no webhooks: nothing registered, nothing queued).
    package static func parse(_ source: ConfigurationSource) throws(ConfigurationError) -> WebhookSettings? {
        let urlText = try source.string("SIWA_WEBHOOK_URL")
        let secretText = try source.string("SIWA_WEBHOOK_SECRET")
        guard let urlText else {
            if secretText != nil {
                throw ConfigurationError(variable: "SIWA_WEBHOOK_SECRET", problem: "is set but SIWA_WEBHOOK_URL is not")
            }
            return nil
        }
        let url = try endpointURL(urlText)
        guard let secretText else {
            throw ConfigurationError(variable: "SIWA_WEBHOOK_SECRET", problem: "is required with SIWA_WEBHOOK_URL")
        }
        let secret = try WebhookSecret(secretText)
        let concurrency = try source.integer("SIWA_WEBHOOK_CONCURRENCY", default: 32, range: 1...512)
        var settings = WebhookSettings(url: url, secret: secret, concurrency: concurrency)
        settings.caCertificates = try CommonSettings.caCertificates(source)
        return settings
    }

    /// `https://…`, or `http://` to a loopback address only (a receiver on the same host); no
    /// credentials (the URL is shown by `siwa status`; the signature is the authentication) and no
    /// fragment.
    package static func endpointURL(_ text: String) throws(ConfigurationError) -> URL {
        func invalid(_ problem: String) -> ConfigurationError {
            ConfigurationError(variable: "SIWA_WEBHOOK_URL", problem: problem)
        }
        guard let components = URLComponents(string: text), let url = components.url,
            let scheme = components.scheme?.lowercased(), let host = components.host, !host.isEmpty
        else { throw invalid("expected an absolute https:// URL") }
        guard components.user == nil, components.password == nil else {
            throw invalid("must not carry credentials (user:password@); receivers authenticate by the signature")
        }
        guard components.fragment == nil else { throw invalid("must not have a #fragment") }
        switch scheme {
        case "https": return url
        case "http":
            guard isLoopback(host) else {
                throw invalid("http:// is allowed only to a loopback address (localhost, 127.0.0.0/8, ::1); use https://")
            }
            return url
        default:
            throw invalid("expected https:// (or http:// to a loopback address), got \(scheme)://")
        }
    }

    static func isLoopback(_ host: String) -> Bool {
        let bare = host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
        if bare.lowercased() == "localhost" || bare == "::1" { return true }
        let octets = bare.split(separator: ".", omittingEmptySubsequences: false)
        guard octets.count == 4, octets.allSatisfy({ UInt8($0) != nil }) else { return false }
        return octets[0] == "127"
    }

    /// The URL without query or credentials, safe to store and show (a query may carry a token).
    package var endpoint: String {
        var components = URLComponents(url: url, resolvingAgainstBaseURL: false) ?? URLComponents()
        components.query = nil
        components.user = nil
        components.password = nil
        return components.string ?? url.absoluteString
    }
}

/// A Standard Webhooks signing secret: `whsec_` + base64 of 24 to 64 random bytes. The key bytes
/// never appear in a description, log or error.
package struct WebhookSecret: Sendable, CustomStringConvertible {
    package let key: [UInt8]

    package init(_ text: String) throws(ConfigurationError) {
        let problem = "expected whsec_ followed by base64 of 24 to 64 random bytes"
        guard text.hasPrefix("whsec_"), let bytes = Data(base64Encoded: String(text.dropFirst(6))),
            (24...64).contains(bytes.count)
        else { throw ConfigurationError(variable: "SIWA_WEBHOOK_SECRET", problem: problem) }
        key = Array(bytes)
    }

    package var description: String { "whsec_<redacted>" }
}
