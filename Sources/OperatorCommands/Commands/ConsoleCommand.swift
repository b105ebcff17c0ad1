import Console
import Foundation
import Logging
import Settings
import Lifecycle

/// `siwa console [--listen 127.0.0.1:9400]`: the operator's web page over the database, until
/// SIGINT or SIGTERM.
enum ConsoleCommand: CLICommand {
    static let name = "console"
    static let summary = "a web page for operators: the queue, deletions, each account's timeline [--listen 127.0.0.1:9400]"

    static func run(_ source: ConfigurationSource) async -> Int32 {
        let settings: ConsoleSettings
        do {
            settings = try ConsoleSettings(source)
        } catch {
            CLI.error(name, "\(error)")
            return 2
        }
        guard source.positional.isEmpty else {
            CLI.error(name, "takes no arguments (--listen HOST:PORT)")
            return 2
        }
        let server = ConsoleServer(settings: settings, logger: Logger(label: "siwa-console", level: settings.logLevel))
        let url: String
        do {
            url = try await server.start()
        } catch {
            CLI.error(name, CLI.oneLine(error))
            return 1
        }
        // Written at once (stdout to a pipe is block-buffered): scripts and tests wait for this line.
        FileHandle.standardOutput.write(Data("console on \(url)\(settings.requiresLogin ? " (log in with one of SIWA_CONSOLE_TOKENS)" : "")\n".utf8))
        _ = await Termination.wait()
        server.stop()
        return 0
    }
}
