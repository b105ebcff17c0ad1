package import Settings

/// The app API's settings (CONTRACT.md, "App API"): nil from `init?` when `SIWA_APP_API_LISTEN` is
/// unset, which means the API is not served.
package struct AppAPIConfiguration: Sendable {
    package static let variables = ["SIWA_APP_API_LISTEN", "SIWA_APP_API_TOKENS", "SIWA_NONCE_TTL"]
    /// Shortest bearer token accepted: ≥ 32 characters, so a token is never guessable.
    package static let minimumTokenLength = 32

    package var listen: ListenAddress
    /// Accepted bearer tokens. Secret: never logged, never put in an error.
    package var tokens: [String]
    package var nonceLifetime: Duration

    package init(listen: ListenAddress, tokens: [String], nonceLifetime: Duration = .seconds(300)) {
        self.listen = listen
        self.tokens = tokens
        self.nonceLifetime = nonceLifetime
    }

    /// Reads the three variables; errors name the variable, never a token.
    package init?(_ source: ConfigurationSource) throws(ConfigurationError) {
        guard try source.string("SIWA_APP_API_LISTEN") != nil else { return nil }
        listen = try source.listenAddress("SIWA_APP_API_LISTEN", default: "")
        guard let tokens = try source.list("SIWA_APP_API_TOKENS") else {
            throw ConfigurationError(
                variable: "SIWA_APP_API_TOKENS", problem: "is required when SIWA_APP_API_LISTEN is set (comma-separated bearer tokens)")
        }
        for (index, token) in tokens.enumerated() where token.count < Self.minimumTokenLength {
            throw ConfigurationError(
                variable: "SIWA_APP_API_TOKENS",
                problem: "token \(index + 1) is shorter than \(Self.minimumTokenLength) characters")
        }
        self.tokens = tokens
        nonceLifetime = try source.duration(
            "SIWA_NONCE_TTL", default: .seconds(300), range: .seconds(10) ... .seconds(3600))
    }
}
