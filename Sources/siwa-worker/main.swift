import AppleJobs
import Foundation
import Lifecycle
import Logging
import Settings
import WorkerCore

if SettingDocuments.asksForHelp(Array(CommandLine.arguments.dropFirst())) {
    print(
        SettingDocuments.programHelp(
            "siwa-worker", about: "Claims jobs (FOR UPDATE SKIP LOCKED), applies notifications, calls Apple (code exchange, revoke) with retries, delivers webhooks and, with SIWA_APP_API_LISTEN, serves the app API. Run any number of them. Stops on SIGTERM or SIGINT within SIWA_SHUTDOWN_GRACE.", reader: .worker), terminator: "")
    exit(0)
}

// Configuration problems end here with exit status 2 and one line naming the variable.
let configuration: WorkerConfiguration
let apple: AppleSettings?
do {
    try CommonSettings.checkProxyVariables()
    configuration = try WorkerConfiguration(ConfigurationSource(arguments: Array(CommandLine.arguments.dropFirst())))
    apple = try appleSettings(configuration)  // loads the .p8 and parses the token keys
} catch {
    FileHandle.standardError.write(Data("siwa-worker: \(error)\n".utf8))
    exit(2)
}

let logger = Logger(label: "siwa-worker", level: configuration.logLevel)
do {
    let service = try WorkerService(configuration: configuration, apple: apple, logger: logger)
    try await service.runUntilSignalled(name: "siwa-worker", logger: logger)
} catch {
    logger.critical("siwa-worker failed", metadata: ["error": "\(error)"])
    exit(1)
}
