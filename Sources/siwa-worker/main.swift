import Foundation
import Logging
import Postgres
import WorkerCore
import AppAPI
import AppleJobs
import Settings
import Metrics
import Lifecycle

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
// The app API (SIWA_APP_API_LISTEN) has connections of its own, so a burst of sign-ins never
// starves the jobs, and the other way round. Its statements and lock waits are bounded by the
// request's own database bound.
let apiPool = configuration.appAPI.map { _ in
    PostgresPool(
        conninfo: configuration.databaseURL, size: 8, acquireTimeout: .seconds(2), applicationName: "siwa-app-api",
        limits: SessionLimits(statementTimeout: AppAPIServer.databaseTimeout, lockTimeout: AppAPIServer.databaseTimeout / 2),
        logger: logger)
}
do {
    // One Apple context (key set, client, token box) for the handlers and the app API.
    let context = try apple.map { try makeAppleJobContext(settings: $0, pool: applePool, logger: logger, metrics: registry) }
    let handlers = context.map(makeAppleHandlers(context:)) ?? []
    if apple == nil {
        logger.warning("SIWA_APPLE_CALLS=disabled: exchange, revoke and reconcile jobs wait until a worker with Apple credentials runs")
    }
    // The effects read SIWA_APP_GROUPS from the database: written before the first batch when the
    // database is reachable, else as soon as it is.
    let groupsStored = await AppGroups.storeOnce(configuration.appGroups, on: applePool, logger: logger)
    let worker = Worker(configuration: configuration, handlers: handlers, logger: logger, registry: registry)
    var api: AppAPIServer?
    if let settings = configuration.appAPI, let context, let apiPool {
        api = AppAPIServer(
            configuration: settings, clientIDs: configuration.clientIDs, apple: context, pool: apiPool, registry: registry,
            logger: logger)
    }
    try await withThrowingTaskGroup(of: Void.self) { group in
        if !groupsStored {
            group.addTask { await AppGroups.storeUntilDone(configuration.appGroups, on: applePool, logger: logger) }
        }
        if apple?.reconcileDaily == true {
            group.addTask { await ReconcileScheduler(pool: applePool, logger: logger).run() }
        }
        if let api { group.addTask { try await api.run() } }
        // main owns the signals: SIGTERM/SIGINT asks the worker for its graceful shutdown; when
        // run() returns (after it, or failing), everything else is cancelled, the wait included.
        group.addTask {
            if let signal = await Termination.signal() {
                logger.info("siwa-worker signalled", metadata: ["signal": .string(signal)])
                worker.shutdown()
            }
        }
        try await worker.run()
        group.cancelAll()
    }
    applePool.close()
    apiPool?.close()
} catch {
    logger.critical("siwa-worker failed", metadata: ["error": "\(error)"])
    exit(1)
}
