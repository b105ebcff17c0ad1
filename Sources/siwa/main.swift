import Foundation
import OperatorCommands

// The operator's command line: every command, its help and its checks live in OperatorCommands.
exit(await OperatorCLI.run(arguments: Array(CommandLine.arguments.dropFirst())))
