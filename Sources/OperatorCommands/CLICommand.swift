import Settings

/// One `siwa` subcommand. `run` returns the exit status: 0 success, 1 failure, 2 bad usage or
/// configuration (one stderr line naming the flag or variable, nothing started).
protocol CLICommand: Sendable {
    /// The word after `siwa` (`migrate`, `status`, ...).
    static var name: String { get }
    /// One line for `siwa help`.
    static var summary: String { get }
    /// Every flag and setting it takes, with meanings and defaults: its help text, and the flags
    /// it accepts (anything else exits 2 before it runs).
    static var usage: CommandUsage { get }
    static func run(_ source: ConfigurationSource) async -> Int32
}
