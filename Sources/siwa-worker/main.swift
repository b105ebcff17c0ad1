import Foundation
import Logging
import Postgres
import SiwaCore
import WorkerCore

// Configuration problems end here with exit status 2 and one line naming the variable.
let configuration: WorkerConfiguration
let apple: AppleSettings?
do {
    configuration = try WorkerConfiguration(ConfigurationSource(arguments: Array(CommandLine.arguments.dropFirst())))
    apple = try appleSettings(configuration)  // loads the .p8 and parses the token keys
} catch {
    FileHandle.standardError.write(Data("siwa-worker: \(error)\n".utf8))
    exit(2)
}

let logger = Logger(label: "siwa-worker", level: configuration.logLevel)
let registry = MetricsRegistry()
apple?.warnIfKeyFileIsShared(logger: logger)
// Notification effects run inside the worker itself (siwa.run_notification_batch); the Apple-calling
// kinds (exchange, revoke, reconcile) have handlers of their own, over a pool of their own.
let applePool = PostgresPool(
    conninfo: configuration.databaseURL, size: min(configuration.concurrency, 8) + 1,
    applicationName: "siwa-worker-apple", limits: configuration.sessionLimits, logger: logger)
do {
    let handlers = try apple.map { try makeAppleHandlers(settings: $0, pool: applePool, logger: logger, metrics: registry) } ?? []
    if apple == nil {
        logger.warning("SIWA_APPLE_CALLS=disabled: exchange, revoke and reconcile jobs wait until a worker with Apple credentials runs")
    }
    let worker = Worker(configuration: configuration, handlers: handlers, logger: logger, registry: registry)
    try await withThrowingTaskGroup(of: Void.self) { group in
        if apple?.reconcileDaily == true {
            group.addTask { await ReconcileScheduler(pool: applePool, logger: logger).run() }
        }
        // The worker returns after SIGTERM/SIGINT and its graceful shutdown; then stop the rest.
        try await worker.run()
        group.cancelAll()
    }
    applePool.close()
} catch {
    logger.critical("siwa-worker failed", metadata: ["error": "\(error)"])
    exit(1)
}
