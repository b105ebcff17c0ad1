import Foundation
import SiwaCore

/// Every subcommand; each lives in Commands/<Name>Command.swift.
let commands: [any CLICommand.Type] = [
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

func printUsage() {
    var text = "usage: siwa <command> [--flag value ...]\n\ncommands:\n"
    for command in commands { text += "  \(command.name.padding(toLength: 14, withPad: " ", startingAt: 0)) \(command.summary)\n" }
    text += "\nEvery setting is an environment variable (DATABASE_URL, ...) or the same name as a --kebab-case flag.\n"
    FileHandle.standardError.write(Data(text.utf8))
}

let arguments = Array(CommandLine.arguments.dropFirst())
guard let name = arguments.first, !["help", "--help", "-h"].contains(name) else {
    printUsage()
    exit(arguments.isEmpty ? 2 : 0)
}
guard let command = commands.first(where: { $0.name == name }) else {
    FileHandle.standardError.write(Data("siwa: unknown command \"\(name)\" (try: siwa help)\n".utf8))
    exit(2)
}
let source: ConfigurationSource
do {
    source = try ConfigurationSource(arguments: Array(arguments.dropFirst()), booleanFlags: command.switches)
} catch {
    FileHandle.standardError.write(Data("siwa \(name): \(error)\n".utf8))
    exit(2)
}
exit(await command.run(source))
