import Foundation
import Logging
import ReceiverCore
import Settings
import Lifecycle

if SettingDocuments.asksForHelp(Array(CommandLine.arguments.dropFirst())) {
    print(
        SettingDocuments.programHelp(
            "siwa-receiver", about: "The HTTP endpoint Apple posts notifications to: verifies each one, stores it and its job in one transaction, answers. Holds no Apple secrets. Stops on SIGTERM or SIGINT after answering the requests in flight.", reader: .receiver), terminator: "")
    exit(0)
}

// Configuration problems end here with exit status 2 and one line naming the variable.
let configuration: ReceiverConfiguration
do {
    try CommonSettings.checkProxyVariables()
    configuration = try ReceiverConfiguration(ConfigurationSource(arguments: Array(CommandLine.arguments.dropFirst())))
} catch {
    FileHandle.standardError.write(Data("siwa-receiver: \(error)\n".utf8))
    exit(2)
}

let logger = Logger(label: "siwa-receiver", level: configuration.logLevel)
do {
    try await Receiver(configuration: configuration, logger: logger).runUntilSignalled(name: "siwa-receiver", logger: logger)
} catch {
    logger.critical("siwa-receiver failed", metadata: ["error": "\(error)"])
    exit(1)
}
