package import Logging
package import Settings

/// What `siwa console` reads before starting: the database, where to listen, and the login tokens
/// a non-loopback listener requires.
package struct ConsoleSettings: Sendable {
    package static let defaultListen = "127.0.0.1:9400"
    package static let minimumTokenLength = 32
    /// Every variable the command reads (each also as a flag, and as `X_FILE`).
    package static let variables = ["DATABASE_URL", "SIWA_LOG_LEVEL", "SIWA_CONSOLE_TOKENS"]

    package var databaseURL: String
    package var listen: ListenAddress
    /// Empty: loopback, no login. Otherwise a login page asks for one of these.
    package var tokens: [String]
    package var logLevel: Logger.Level

    package init(databaseURL: String, listen: ListenAddress, tokens: [String] = [], logLevel: Logger.Level = .info) {
        self.databaseURL = databaseURL
        self.listen = listen
        self.tokens = tokens
        self.logLevel = logLevel
    }

    /// `--listen HOST:PORT` (command line only) and the variables above; throws the one-line problem.
    package init(_ source: ConfigurationSource) throws(ConfigurationError) {
        if let unknown = source.unknownFlags(known: Self.variables + Self.variables.map { $0 + "_FILE" } + ["LISTEN"]).first {
            throw ConfigurationError(variable: "--\(unknown)", problem: "unknown option")
        }
        databaseURL = try CommonSettings.databaseURL(source)
        logLevel = try CommonSettings(source).logLevel
        let text = source.option("listen") ?? Self.defaultListen
        guard let listen = ListenAddress(text) else {
            throw ConfigurationError(variable: "--listen", problem: "expected host:port (e.g. 127.0.0.1:9400), got \"\(text)\"")
        }
        self.listen = listen
        tokens = try source.list("SIWA_CONSOLE_TOKENS") ?? []
        if let short = tokens.firstIndex(where: { $0.count < Self.minimumTokenLength }) {
            throw ConfigurationError(
                variable: "SIWA_CONSOLE_TOKENS",
                problem: "token \(short + 1) is shorter than \(Self.minimumTokenLength) characters")
        }
        if tokens.isEmpty && !CommonSettings.isLoopback(listen.host) {
            throw ConfigurationError(
                variable: "SIWA_CONSOLE_TOKENS",
                problem: "is required to listen on \(listen) (not a loopback address): comma-separated tokens of at least "
                    + "\(Self.minimumTokenLength) characters, asked for by a login page")
        }
    }

    /// True when pages ask for a token first.
    package var requiresLogin: Bool { !tokens.isEmpty }
}
