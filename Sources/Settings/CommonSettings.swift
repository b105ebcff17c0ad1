package import Foundation
package import Logging

/// Settings every executable shares.
package struct CommonSettings: Sendable {
    package static let variables = [
        "DATABASE_URL", "SIWA_LOG_LEVEL", "SIWA_APPLE_BASE_URL", "SIWA_CLIENT_IDS", "SIWA_CA",
    ]

    package var logLevel: Logger.Level
    package var appleBaseURL: URL
    /// `SIWA_CA_FILE`: PEM certificates trusted for `https://` calls besides the system's.
    package var caCertificates: String?

    package init(_ source: ConfigurationSource) throws(ConfigurationError) {
        let levelText = try source.string("SIWA_LOG_LEVEL") ?? "info"
        guard let level = Logger.Level(configurationValue: levelText) else {
            throw ConfigurationError(
                variable: "SIWA_LOG_LEVEL", problem: "expected debug, info, warn or error, got \"\(levelText)\"")
        }
        logLevel = level
        appleBaseURL = try Self.appleBaseURL(source)
        caCertificates = try Self.caCertificates(source)
    }

    /// The certificates of `SIWA_CA_FILE` (a PEM file; `SIWA_CA` may hold the PEM itself), trusted
    /// for every `https://` call in addition to the system's store; nil when unset. Read once, at
    /// start: a file that holds no certificate stops the process instead of failing every call.
    package static func caCertificates(_ source: ConfigurationSource) throws(ConfigurationError) -> String? {
        guard let pem = try source.string("SIWA_CA") else { return nil }
        guard pem.contains("-----BEGIN CERTIFICATE-----") else {
            throw ConfigurationError(variable: "SIWA_CA_FILE", problem: "holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
        }
        return pem
    }

    package static func appleBaseURL(_ source: ConfigurationSource) throws(ConfigurationError) -> URL {
        let text = try source.string("SIWA_APPLE_BASE_URL") ?? "https://appleid.apple.com"
        guard let url = URL(string: text.hasSuffix("/") ? String(text.dropLast()) : text),
            let scheme = url.scheme, ["http", "https"].contains(scheme), let host = url.host
        else {
            throw ConfigurationError(variable: "SIWA_APPLE_BASE_URL", problem: "expected an http(s) URL, got \"\(text)\"")
        }
        // The worker sends client_secrets and refresh tokens there: in clear text only to a
        // stand-in on this machine (siwa dev, tests, benchmarks).
        guard scheme == "https" || isLoopback(host) else {
            throw ConfigurationError(
                variable: "SIWA_APPLE_BASE_URL", problem: "http:// is allowed only for a loopback host (127.0.0.1, ::1, localhost), got \"\(text)\"")
        }
        return url
    }

    /// The proxy variables libcurl reads. Only an `http://` or `https://` proxy (or one written
    /// without a scheme, which curl takes as http) is accepted: a SOCKS proxy (`socks5://`, ...) would
    /// carry calls past the rules our own HTTP client keeps (deploy/README.md, "Calls out";
    /// Sources/AppAPI/README.md, "The edge"). Calls
    /// to a loopback address never use any of them (`HTTPClient`).
    package static let proxyVariables = ["http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"]

    /// Refuses, at start, a proxy variable whose scheme is not http or https, naming it.
    package static func checkProxyVariables(_ environment: [String: String] = ProcessInfo.processInfo.environment)
        throws(ConfigurationError)
    {
        for name in proxyVariables {
            guard let value = environment[name]?.trimmingCharacters(in: .whitespaces), !value.isEmpty,
                let schemeEnd = value.range(of: "://")
            else { continue }
            let scheme = value[..<schemeEnd.lowerBound].lowercased()
            guard scheme == "http" || scheme == "https" else {
                throw ConfigurationError(
                    variable: name, problem: "names a \(scheme):// proxy; only http:// and https:// proxies are used")
            }
        }
    }

    /// 127.0.0.0/8, ::1 or localhost.
    package static func isLoopback(_ host: String) -> Bool {
        let bare = host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
        if bare.lowercased() == "localhost" || bare == "::1" { return true }
        let octets = bare.split(separator: ".", omittingEmptySubsequences: false)
        return octets.count == 4 && octets[0] == "127" && octets.allSatisfy { UInt8($0) != nil }
    }

    /// `DATABASE_URL` as libpq takes it: a `postgres://` / `postgresql://` URI or `key=value` conninfo.
    package static func databaseURL(_ source: ConfigurationSource) throws(ConfigurationError) -> String {
        let value = try source.require("DATABASE_URL")
        let looksLikeURI = value.hasPrefix("postgres://") || value.hasPrefix("postgresql://")
        let looksLikeConninfo = value.contains("=")
        guard looksLikeURI || looksLikeConninfo else {
            throw ConfigurationError(
                variable: "DATABASE_URL", problem: "expected a postgresql:// URI or key=value conninfo")
        }
        return value
    }

    package static func clientIDs(_ source: ConfigurationSource) throws(ConfigurationError) -> [String] {
        guard let ids = try source.list("SIWA_CLIENT_IDS") else {
            throw ConfigurationError(
                variable: "SIWA_CLIENT_IDS", problem: "is required (comma-separated bundle IDs / Services IDs)")
        }
        return ids
    }
}
