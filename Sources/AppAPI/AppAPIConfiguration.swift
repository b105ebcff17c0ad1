package import Settings

/// The app API's settings (Sources/AppAPI/README.md): nil from `init?` when `SIWA_APP_API_LISTEN` is
/// unset, which means the API is not served.
package struct AppAPIConfiguration: Sendable {
    package static let variables = [
        "SIWA_APP_API_LISTEN", "SIWA_APP_API_TOKENS", "SIWA_NONCE_TTL", "SIWA_APP_API_REQUEST_TIMEOUT",
        "SIWA_APP_API_CONNECTIONS_PER_ADDRESS", "SIWA_NONCE_MAX_UNSPENT",
    ]
    /// Shortest bearer token accepted: ≥ 32 characters, so a token is never guessable.
    package static let minimumTokenLength = 32

    package var listen: ListenAddress
    /// Accepted bearer tokens. Secret: never logged, never put in an error.
    package var tokens: [String]
    package var nonceLifetime: Duration
    /// A request's headers and body must have arrived within this, else its connection is closed.
    package var requestTimeout: Duration
    /// Open connections one client address may hold; more are refused at once.
    package var connectionsPerAddress: Int
    /// Unspent nonces kept at once; past it `POST /v1/nonces` answers 429.
    package var maximumUnspentNonces: Int

    package init(
        listen: ListenAddress, tokens: [String], nonceLifetime: Duration = .seconds(300), requestTimeout: Duration = .seconds(10),
        connectionsPerAddress: Int = 64, maximumUnspentNonces: Int = 100_000
    ) {
        self.listen = listen
        self.tokens = tokens
        self.nonceLifetime = nonceLifetime
        self.requestTimeout = requestTimeout
        self.connectionsPerAddress = connectionsPerAddress
        self.maximumUnspentNonces = maximumUnspentNonces
    }

    /// Reads the variables; errors name the variable, never a token.
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
        requestTimeout = try source.duration(
            "SIWA_APP_API_REQUEST_TIMEOUT", default: .seconds(10), range: .seconds(1) ... .seconds(300))
        connectionsPerAddress = try source.integer("SIWA_APP_API_CONNECTIONS_PER_ADDRESS", default: 64, range: 1...100_000)
        maximumUnspentNonces = try source.integer("SIWA_NONCE_MAX_UNSPENT", default: 100_000, range: 1...100_000_000)
    }
}
