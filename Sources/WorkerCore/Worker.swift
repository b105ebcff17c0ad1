internal import AppleClient
internal import Foundation
package import JobQueue
package import Logging
internal import Postgres
import Locking
import Webhooks
package import Metrics
import Settings

/// The running worker: applies notification effects in batches, runs the Apple-calling jobs through
/// their handlers, keeps leases alive, rescues expired ones, prunes old rows, and serves /metrics
/// (`OpsServer`). Its loops live in files of their own: `Worker+Notifications.swift`,
/// `Worker+Calls.swift`, `Worker+WakeUps.swift`, `Worker+Maintenance.swift`.
///
/// Wake-ups come from `LISTEN siwa_jobs` (unless `listenNotify` is false) and from a poll every
/// `pollInterval`; the poll alone drains the queue. On SIGTERM/SIGINT it stops claiming, lets
/// in-flight jobs finish for `shutdownGrace`, hands the rest back (fenced) and returns.
package final class Worker: Sendable {
    package let configuration: WorkerConfiguration
    package let registry: MetricsRegistry
    let metrics: WorkerMetrics
    let logger: Logger
    let handlers: [JobKind: any JobHandler]
    let pool: PostgresPool
    let queue: JobQueue
    let gate: StoredNotificationGate
    let policy: RetryPolicy
    private let server: OpsServer
    let state = Locked(State())
    let notificationBell = Doorbell()
    let callBell = Doorbell()
    let maintenanceBell = Doorbell()
    private let shutdownBell = Doorbell()
    /// Deliveries to `SIWA_WEBHOOK_URL`, when set.
    let webhooks: WebhookDispatcher?

    /// Between tries while no database is writable: short, since a failover takes seconds.
    static let databaseBackoff = RetryPolicy(base: .milliseconds(100), cap: .seconds(2))

    struct State {
        var stopping = false
        var shutdownRequested = false
        var inFlight: [Int64: Job] = [:]
        /// A notification batch left jobs queued (their accounts were busy) and its loop waits for
        /// the bell: the next batch that takes any job rings it.
        var deferredWaiting = false
        /// Whether batches skip users other batches are taking (shared by this process's loops).
        var busyAccounts = BusyAccountAvoidance()
        /// When each notification session's plans are made again (shared by this process's loops).
        var sessionPlans = SessionPlans()
    }

    /// - Parameter registry: shared with the handlers so their counters appear on `/metrics`.
    package init(
        configuration: WorkerConfiguration, handlers: [any JobHandler], logger: Logger,
        registry: MetricsRegistry = MetricsRegistry()
    ) {
        self.registry = registry
        self.configuration = configuration
        self.logger = logger
        policy = RetryPolicy(base: configuration.retryBase, cap: .seconds(3600))
        var byKind: [JobKind: any JobHandler] = [:]
        for handler in handlers where handler.kind != .notification { byKind[handler.kind] = handler }
        self.handlers = byKind
        metrics = WorkerMetrics(registry: registry)
        pool = PostgresPool(
            conninfo: configuration.databaseURL,
            size: 3 + min(configuration.concurrency, 8) + configuration.notificationConnections,
            acquireTimeout: .seconds(10), applicationName: "siwa-worker", limits: configuration.sessionLimits,
            logger: logger)
        queue = JobQueue(pool: pool)
        // Apple's keys, fetched only when a held notification names a kid not yet seen (a worker
        // that never sees one never calls Apple for them).
        gate = StoredNotificationGate(
            keys: AppleKeySet(
                http: AppleHTTP(baseURL: configuration.apple.baseURL, timeout: .seconds(5), caCertificates: configuration.apple.caCertificates), logger: logger,
                minimumRefetchInterval: .seconds(10)),
            logger: logger,
            forged: registry.counter(
                "siwa_worker_notifications_forged_total",
                help: "Stored notifications whose jws did not verify against Apple's keys or its claims (never applied)."))
        webhooks = configuration.webhook.map { settings in
            WebhookDispatcher(
                settings: settings, databaseURL: configuration.databaseURL,
                options: .init(
                    workerID: configuration.workerID, lease: configuration.jobLease, pollInterval: configuration.pollInterval,
                    shutdownGrace: configuration.shutdownGrace, retryPolicy: RetryPolicy(base: configuration.retryBase, cap: .seconds(3600)),
                    limits: configuration.sessionLimits),
                registry: registry, logger: logger)
        }
        server = OpsServer(listen: configuration.opsListen, pool: pool, registry: registry, logger: logger)
    }

    /// The bound ops port (useful with port 0).
    package var opsPort: Int { server.port }

    var stopping: Bool { state.withLock { $0.stopping } }

    /// Asks `run()` to stop: no new claims, jobs in flight get `SIWA_SHUTDOWN_GRACE`, then `run()`
    /// returns. Cancelling the task that runs `run()` does the same (signals belong to `main`).
    package func shutdown() {
        state.withLock { $0.shutdownRequested = true }
        shutdownBell.ringAll()
    }

    /// Runs until `shutdown()` or cancellation, then shuts down gracefully and returns.
    ///
    /// Cancellation means the graceful stop, as for every `Service`: the loops run in a task of
    /// their own, which the caller's cancellation does not reach (so jobs in flight keep their Apple
    /// calls and get the grace), and the cancellation asks them to stop.
    package func run() async throws {
        let work = Task { try await self.serve() }
        try await withTaskCancellationHandler {
            try await work.value
        } onCancel: {
            shutdown()
        }
    }

    private func serve() async throws {
        try server.start()
        logger.info(
            "siwa-worker started",
            metadata: [
                "worker_id": .string(configuration.workerID), "ops_listen": "\(configuration.opsListen.host):\(server.port)",
                "concurrency": .int(configuration.concurrency), "listen_notify": .bool(configuration.listenNotify),
                "apple_calls": .bool(configuration.apple.callsEnabled), "webhooks": .bool(webhooks != nil),
                "handlers": .string(handlers.keys.map(\.rawValue).sorted().joined(separator: ",")),
            ])
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<configuration.notificationConnections { group.addTask { await self.notificationLoop() } }
            // Without Apple credentials there is no handler to run an Apple-calling job: such a
            // worker claims none, so they wait, untouched, for one that has them (claiming them only
            // to snooze each for a minute delayed the revokes a capable worker beside it would run).
            if !handlers.isEmpty { group.addTask { await self.dispatchLoop() } }
            group.addTask { await self.maintenanceLoop() }
            if configuration.listenNotify { group.addTask { await self.listenLoop() } }
            if let webhooks { group.addTask { await webhooks.run() } }
            while !state.withLock({ $0.shutdownRequested }) { await shutdownBell.wait(timeout: .seconds(60)) }
            logger.info("siwa-worker stopping")
            state.withLock { $0.stopping = true }
            notificationBell.ringAll()
            callBell.ring()
            maintenanceBell.ring()
            webhooks?.stop()
            await group.waitForAll()
        }
        await server.stop()
        pool.close()
        logger.info("siwa-worker stopped")
    }
}
