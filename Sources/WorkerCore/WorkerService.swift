import AppAPI
package import AppleJobs
import Lifecycle
package import Logging
import Metrics
import Postgres

/// Everything `siwa-worker` runs, started in one place: the `Worker` (its loops and its ops
/// server; it runs the webhook dispatcher when `SIWA_WEBHOOK_URL` is set), the app API with
/// `SIWA_APP_API_LISTEN`, `SIWA_APP_GROUPS` stored until the database takes it, and the daily
/// reconcile with `SIWA_RECONCILE_DAILY`. A `Service`: cancelling `run()` stops them all, the
/// worker gracefully (`SIWA_SHUTDOWN_GRACE`).
package struct WorkerService: Service {
    private let configuration: WorkerConfiguration
    private let apple: AppleSettings?
    private let logger: Logger
    private let worker: Worker
    private let api: AppAPIServer?
    /// The Apple-calling kinds' connections (and the app groups' and reconcile's).
    private let applePool: PostgresPool
    private let apiPool: PostgresPool?

    /// - Parameter apple: the checked Apple settings (`appleSettings(_:)`); nil when Apple calls are disabled.
    package init(configuration: WorkerConfiguration, apple: AppleSettings?, logger: Logger) throws {
        self.configuration = configuration
        self.apple = apple
        self.logger = logger
        let registry = MetricsRegistry()
        apple?.warnIfKeyFileIsShared(logger: logger)
        // Notification effects run inside the worker itself (siwa.run_notification_batch); the Apple-calling
        // kinds (exchange, revoke, reconcile) have handlers of their own, over a pool of their own.
        let applePool = PostgresPool(
            conninfo: configuration.databaseURL, size: min(configuration.concurrency, 8) + 1,
            applicationName: "siwa-worker-apple", limits: configuration.sessionLimits, logger: logger)
        // The app API (SIWA_APP_API_LISTEN) has connections of its own, so a burst of sign-ins never
        // starves the jobs, and the other way round. Its statements' replies are awaited on the reply
        // watcher (a sign-in's three statements cost no queue thread's wake-ups; 12-15 % less CPU a
        // sign-in). The job loops keep the queue's path: on the watcher their batches were slower in
        // 10 of 12 cells of one worker bench (a reply's reading may wait for a pool thread busy
        // verifying notifications), though within noise in another; kept until a quiet run says. Its statements and lock waits are bounded by the
        // request's own database bound. 16: a sign-in holds a connection only for each statement,
        // but at 8, 16 requests in flight queued for one (a lease that waits costs its task a
        // suspension and a wake-up on another thread, two more context switches).
        let apiPool = configuration.appAPI.map { _ in
            PostgresPool(
                conninfo: configuration.databaseURL, size: 16, acquireTimeout: .seconds(2), applicationName: "siwa-app-api",
                limits: SessionLimits(statementTimeout: AppAPIServer.databaseTimeout, lockTimeout: AppAPIServer.databaseTimeout / 2),
                watchingReplies: true, logger: logger)
        }
        // One Apple context (key set, client, token box) for the handlers and the app API.
        let context = try apple.map { try makeAppleJobContext(settings: $0, pool: applePool, logger: logger, metrics: registry) }
        let handlers = context.map(makeAppleHandlers(context:)) ?? []
        if apple == nil {
            logger.warning("SIWA_APPLE_CALLS=disabled: exchange, revoke and reconcile jobs wait until a worker with Apple credentials runs")
        }
        worker = Worker(configuration: configuration, handlers: handlers, logger: logger, registry: registry)
        if let settings = configuration.appAPI, let context, let apiPool {
            api = AppAPIServer(
                configuration: settings, clientIDs: configuration.clientIDs, apple: context, pool: apiPool, registry: registry,
                logger: logger)
        } else {
            api = nil
        }
        self.applePool = applePool
        self.apiPool = apiPool
    }

    package func run() async throws {
        defer {
            applePool.close()
            apiPool?.close()
        }
        // The effects read SIWA_APP_GROUPS from the database: written before the first batch when the
        // database is reachable, else as soon as it is.
        let groupsStored = await AppGroups.storeOnce(configuration.appGroups, on: applePool, logger: logger)
        try await withThrowingTaskGroup(of: Void.self) { group in
            let (configuration, applePool, logger) = (configuration, applePool, logger)
            if !groupsStored {
                group.addTask { await AppGroups.storeUntilDone(configuration.appGroups, on: applePool, logger: logger) }
            }
            if apple?.reconcileDaily == true {
                group.addTask { await ReconcileScheduler(pool: applePool, logger: logger).run() }
            }
            if let api { group.addTask { try await api.run() } }
            // Returns after a cancellation (graceful) or when it fails; the rest stops with it.
            try await worker.run()
            group.cancelAll()
        }
    }
}
