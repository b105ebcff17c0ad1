import Foundation
import Settings

/// The `siwa` command line: which command a line names, its help, its flags checked before it
/// runs. `Sources/siwa/main.swift` calls `run` and exits with what it returns.
package enum OperatorCLI {
    /// Every subcommand; each lives in Commands/<Name>Command.swift.
    static let commands: [any CLICommand.Type] = [
        MigrateCommand.self,
        StatusCommand.self,
        JobsCommand.self,
        DevCommand.self,
        FakeAppleCommand.self,
        SimulateCommand.self,
        AccountsCommand.self,
        WebhooksCommand.self,
        ConsoleCommand.self,
    ]
    /// Commands for the project's own scripts and tests, not listed by `siwa help`.
    static let hiddenCommands: [any CLICommand.Type] = [ConfigReferenceCommand.self]

    static func overview() -> String {
        var text = "usage: siwa <command> [--flag value | --flag=value ...]\n\ncommands:\n"
        for command in commands { text += "  \(command.name.padding(toLength: 14, withPad: " ", startingAt: 0)) \(command.summary)\n" }
        text += "\n`siwa help COMMAND` (or `siwa COMMAND --help`) lists a command's flags and settings.\n"
        text += "Every setting is an environment variable (DATABASE_URL, ...) or the same name as a --kebab-case flag.\n"
        return text
    }

    static func command(named name: String) -> (any CLICommand.Type)? {
        (commands + hiddenCommands).first { $0.name == name }
    }

    static func unknownCommand(_ name: String) -> Int32 {
        FileHandle.standardError.write(Data("siwa: unknown command \"\(name)\" (try: siwa help)\n".utf8))
        return 2
    }

    /// Runs the command `arguments` (the words after `siwa`) names and returns the exit status:
    /// 0 success, 1 failure, 2 bad usage or configuration (see `CLICommand`).
    package static func run(arguments: [String]) async -> Int32 {
        guard let name = arguments.first else {
            FileHandle.standardError.write(Data(overview().utf8))
            return 2
        }
        if ["help", "--help", "-h"].contains(name) {
            // `siwa help` lists the commands; `siwa help COMMAND` is that command's usage.
            guard let topic = arguments.dropFirst().first else {
                print(overview(), terminator: "")
                return 0
            }
            guard let command = command(named: topic) else { return unknownCommand(topic) }
            print(command.usage.text(), terminator: "")
            return 0
        }
        guard let command = command(named: name) else { return unknownCommand(name) }
        let rest = Array(arguments.dropFirst())
        // Help wins over everything else on the line: nothing is checked, nothing is started.
        if rest.contains("--help") || rest.contains("-h") {
            print(command.usage.text(), terminator: "")
            return 0
        }
        let source: ConfigurationSource
        do {
            try CommonSettings.checkProxyVariables()
            source = try ConfigurationSource(arguments: rest, booleanFlags: command.usage.switches, knownFlags: command.usage.valueFlags)
            if let stray = command.usage.arguments.stray(in: source.positional) {
                throw ConfigurationError(variable: "\"\(stray)\"", problem: "unexpected argument (siwa help \(name) shows what it takes)")
            }
        } catch let error as ConfigurationError where error.problem == "unknown option" {
            FileHandle.standardError.write(Data("siwa \(name): \(error) (siwa help \(name) lists them)\n".utf8))
            return 2
        } catch {
            FileHandle.standardError.write(Data("siwa \(name): \(error)\n".utf8))
            return 2
        }
        return await command.run(source)
    }
}
