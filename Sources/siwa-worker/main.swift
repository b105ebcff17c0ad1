import Foundation
import Logging
import SiwaCore
import WorkerCore

// Configuration problems end here with exit status 2 and one line naming the variable.
let configuration: WorkerConfiguration
do {
    configuration = try WorkerConfiguration(ConfigurationSource(arguments: Array(CommandLine.arguments.dropFirst())))
} catch {
    FileHandle.standardError.write(Data("siwa-worker: \(error)\n".utf8))
    exit(2)
}

let logger = Logger(label: "siwa-worker", level: configuration.logLevel)
// Notification effects run inside the worker itself (siwa.run_notification_batch); the Apple-calling
// kinds (exchange, revoke, reconcile) come from makeAppleHandlers (Sources/WorkerCore/AppleHandlers.swift).
let handlers = makeAppleHandlers(configuration: configuration, logger: logger)
do {
    try await Worker(configuration: configuration, handlers: handlers, logger: logger).run()
} catch {
    logger.critical("siwa-worker failed", metadata: ["error": "\(error)"])
    exit(1)
}
