import SiwaCore

/// One `siwa` subcommand. `run` returns the exit status: 0 success, 1 failure, 2 bad usage or
/// configuration (one stderr line naming the variable, nothing started).
protocol CLICommand: Sendable {
    /// The word after `siwa` (`migrate`, `status`, ...).
    static var name: String { get }
    /// One line for `siwa help`.
    static var summary: String { get }
    /// Flags that take no value (`json` for `--json`).
    static var switches: Set<String> { get }
    static func run(_ source: ConfigurationSource) async -> Int32
}

extension CLICommand {
    static var switches: Set<String> { [] }
}
