import Foundation
import Logging
import ReceiverCore
import SiwaCore

// Configuration problems end here with exit status 2 and one line naming the variable.
let configuration: ReceiverConfiguration
do {
    configuration = try ReceiverConfiguration(ConfigurationSource(arguments: Array(CommandLine.arguments.dropFirst())))
} catch {
    FileHandle.standardError.write(Data("siwa-receiver: \(error)\n".utf8))
    exit(2)
}

let logger = Logger(label: "siwa-receiver", level: configuration.logLevel)
do {
    try await Receiver(configuration: configuration, logger: logger).run()
} catch {
    logger.critical("siwa-receiver failed", metadata: ["error": "\(error)"])
    exit(1)
}
