internal import AppleClient
internal import Dispatch
internal import Foundation
internal import HTTPServer
package import JobQueue
package import Logging
internal import Postgres
package import SiwaCore
import Locking
import Webhooks

/// The running worker: applies notification effects in batches, runs the Apple-calling jobs through
/// their handlers, keeps leases alive, rescues expired ones, prunes old rows, and serves /metrics.
///
/// Wake-ups come from `LISTEN siwa_jobs` (unless `listenNotify` is false) and from a poll every
/// `pollInterval`; the poll alone drains the queue. On SIGTERM/SIGINT it stops claiming, lets
/// in-flight jobs finish for `shutdownGrace`, hands the rest back (fenced) and returns.
package final class Worker: Sendable {
    package let configuration: WorkerConfiguration
    package let registry: MetricsRegistry
    private let metrics: WorkerMetrics
    private let logger: Logger
    private let handlers: [JobKind: any JobHandler]
    private let pool: PostgresPool
    private let queue: JobQueue
    private let gate: StoredNotificationGate
    private let policy: RetryPolicy
    private let server: HTTPServer
    private let state = Locked(State())
    private let notificationBell = Doorbell()
    private let callBell = Doorbell()
    private let maintenanceBell = Doorbell()
    private let shutdownBell = Doorbell()
    /// Deliveries to `SIWA_WEBHOOK_URL`, when set.
    private let webhooks: WebhookDispatcher?

    /// Between tries while no database is writable: short, since a failover takes seconds.
    static let databaseBackoff = RetryPolicy(base: .milliseconds(100), cap: .seconds(2))

    private struct State {
        var stopping = false
        var shutdownRequested = false
        var inFlight: [Int64: Job] = [:]
        /// A notification batch left jobs queued (their accounts were busy) and its loop waits for
        /// the bell: the next batch that takes any job rings it.
        var deferredWaiting = false
        /// Whether batches skip users other batches are taking (shared by this process's loops).
        var busyAccounts = BusyAccountAvoidance()
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
        let registry = registry
        let pool = pool
        server = HTTPServer(
            configuration: .init(
                host: configuration.opsListen.host, port: configuration.opsListen.port, threadCount: 1,
                connectionLimit: 64, connectionTimeout: .seconds(10), maxBodyBytes: 1024,
                shutdownGracePeriod: .seconds(1)),
            logger: logger,
            asyncRespond: { request in
                guard request.method == "GET" else { return .json(status: 405, #"{"error":"method_not_allowed"}"#) }
                switch request.path {
                case "/healthz": return .json(#"{"status":"ok"}"#)
                case "/readyz":
                    let ready = (try? await pool.withConnection { try await $0.query("SELECT 1") }) != nil
                    return ready ? .json(#"{"status":"ready"}"#) : .json(status: 503, #"{"error":"database_unreachable"}"#)
                case "/metrics":
                    return HTTPResponse(
                        status: 200, headers: [("Content-Type", "text/plain; version=0.0.4")],
                        body: Array(registry.render().utf8))
                default: return .json(status: 404, #"{"error":"not_found"}"#)
                }
            })
    }

    /// The bound ops port (useful with port 0).
    package var opsPort: Int { server.port }

    private var stopping: Bool { state.withLock { $0.stopping } }

    /// Asks `run()` to stop: no new claims, jobs in flight get `SIWA_SHUTDOWN_GRACE`, then `run()`
    /// returns. The executable calls it on SIGTERM/SIGINT (signals belong to `main`, not to this
    /// library); cancelling the task that runs `run()` does the same, without the grace.
    package func shutdown() {
        state.withLock { $0.shutdownRequested = true }
        shutdownBell.ringAll()
    }

    /// Runs until `shutdown()` or cancellation, then shuts down gracefully and returns.
    package func run() async throws {
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
            group.addTask { await self.dispatchLoop() }
            group.addTask { await self.maintenanceLoop() }
            if configuration.listenNotify { group.addTask { await self.listenLoop() } }
            if let webhooks { group.addTask { await webhooks.run() } }
            await withTaskCancellationHandler {
                while !state.withLock({ $0.shutdownRequested }) { await shutdownBell.wait(timeout: .seconds(60)) }
            } onCancel: {
                shutdown()
            }
            logger.info("siwa-worker stopping")
            state.withLock { $0.stopping = true }
            notificationBell.ringAll()
            callBell.ring()
            maintenanceBell.ring()
            webhooks?.stop()
            await group.waitForAll()
        }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            DispatchQueue.global().async {
                self.server.stop()
                continuation.resume()
            }
        }
        pool.close()
        logger.info("siwa-worker stopped")
    }

    // MARK: Wake-ups

    /// `LISTEN siwa_jobs` on a dedicated connection; each burst of NOTIFYs rings as many notification
    /// loops as it announces batches of notification jobs, and the Apple-calling loop and the
    /// webhook dispatcher when it announces jobs of theirs (`JobWakeUp`).
    private func listenLoop() async {
        var connection: PostgresConnection?
        var failures = 0
        while !stopping {
            do {
                if connection == nil {
                    let fresh = try await PostgresConnection.connect(
                        to: configuration.databaseURL, applicationName: "siwa-worker-listen",
                        limits: configuration.sessionLimits, logger: logger)
                    try await fresh.listen("siwa_jobs")
                    connection = fresh
                    if failures > 0 {
                        logger.info("siwa-worker listening again", metadata: ["db.server": .string(fresh.server)])
                    }
                    failures = 0
                    notificationBell.ring()  // anything queued while we were not listening
                    callBell.ring()
                    webhooks?.wake()
                }
                let notifications = try await connection!.waitForNotifications(timeout: .milliseconds(250))
                // No jitter before claiming: workers woken by the same NOTIFY are kept apart by
                // SKIP LOCKED (the others' claims come back empty at once), and a random pause would
                // only add to every effect's delay.
                if !notifications.isEmpty, !stopping {
                    let wakeUp = JobWakeUp(notifications)
                    for _ in 0..<batchesFor(wakeUp.notificationJobs) { notificationBell.ring() }
                    if wakeUp.calls { callBell.ring() }
                    if wakeUp.webhooks { webhooks?.wake() }
                }
            } catch {
                // A NOTIFY sent while we reconnect is missed; the poll picks its job up.
                failures += 1
                if failures == 1 {
                    logger.warning("siwa-worker listen connection failed; polling meanwhile", metadata: ["error": "\(error)"])
                }
                connection?.close()
                connection = nil
                await maintenanceBellFreeSleep(.seconds(1))
            }
        }
        connection?.close()
    }

    /// How many notification loops a wake-up should start: one per full batch of the notification
    /// jobs the NOTIFY payloads announce, at most one per loop; none when they announce none.
    private func batchesFor(_ queued: Int) -> Int {
        let batches = (queued + configuration.notificationBatch - 1) / configuration.notificationBatch
        return min(batches, configuration.notificationConnections)
    }

    private func maintenanceBellFreeSleep(_ duration: Duration) async {
        let deadline = ContinuousClock.now + duration
        while !stopping, ContinuousClock.now < deadline { try? await Task.sleep(for: .milliseconds(50)) }
    }

    // MARK: Notifications (hot path)

    /// One of `notificationConnections` loops. A loop that claimed a full batch rings the bell
    /// before going on, so an idle loop joins in while a backlog lasts; a trickle wakes one loop.
    ///
    /// The batch size adapts to contention (`NotificationBatchLimit`).
    private func notificationLoop() async {
        var limit = NotificationBatchLimit(largest: configuration.notificationBatch)
        var retry = DeferredRetry(pollInterval: configuration.pollInterval)
        var lastBatch = Duration.zero
        var failures = 0
        let (gate, metrics) = (gate, metrics)
        let verifyHeld: @Sendable (PostgresConnection, PostgresRows) async throws -> JobQueue.HeldVerdicts = {
            connection, rows in
            let started = ContinuousClock.now
            defer { metrics.verifySeconds.observe((ContinuousClock.now - started).seconds) }
            return try await gate.verifyHeld(rows, on: connection)
        }
        while !stopping {
            do {
                var again = false
                repeat {
                    let started = ContinuousClock.now
                    let skipBusyAccounts = state.withLock { $0.busyAccounts.isActive(at: started) }
                    let (results, held) = try await queue.runVerifiedNotificationBatch(
                        worker: configuration.workerID, limit: limit.value, lease: configuration.jobLease, policy: policy,
                        skipBusyAccounts: skipBusyAccounts, verifyHeld: verifyHeld)
                    lastBatch = ContinuousClock.now - started
                    metrics.batchSeconds.observe(lastBatch.seconds)
                    gate.report(held)
                    let deferred = results.count { $0.state == "deferred" }
                    let taken = results.count - deferred
                    metrics.batchJobs.observe(Double(taken))
                    let full = taken == limit.value
                    if deferred > 0 { metrics.deferred.increment(by: deferred) }
                    limit.record(taken: taken, deferred: deferred)
                    retry.record(deferred: deferred)
                    // A loop that deferred jobs waits for the bell: the next batch of this process that
                    // took any job (its accounts' locks are gone with its commit) rings it, and
                    // `DeferredRetry` bounds the wait for a holder the bell cannot tell about.
                    let wake = state.withLock { state -> Bool in
                        state.busyAccounts.record(deferred: deferred, at: ContinuousClock.now)
                        let wake = full || (taken > 0 && state.deferredWaiting)
                        if taken > 0 { state.deferredWaiting = false }
                        if deferred > 0 { state.deferredWaiting = true }
                        return wake
                    }
                    if wake { notificationBell.ring() }
                    record(results)
                    if failures > 0 {
                        logger.info("siwa-worker: database available again", metadata: ["failed_batches": .int(failures)])
                    }
                    failures = 0
                    // After deferring, going again at once would only find the same accounts busy.
                    again = full && deferred == 0
                } while again && !stopping
            } catch {
                failures += 1
                metrics.batchFailures.increment()
                if (error as? PostgresError)?.sqlState == "53200",
                    state.withLock({ $0.busyAccounts.standDown(at: ContinuousClock.now) })
                {
                    // Out of shared memory: most likely the lock table, full of the advisory locks
                    // that keep batches over hot accounts apart. Batches defer instead for a while.
                    logger.warning(
                        "siwa-worker: PostgreSQL's lock table is full; batches stop skipping busy accounts for a while (raise max_locks_per_transaction)",
                        metadata: ["kind": "notification", "error": "\(error)"])
                }
                if error.isPostgresConnectionProblem {
                    // No writable database (a restart, a failover): say so once, then try again
                    // soon, so the new primary's backlog starts draining within seconds.
                    if failures == 1 {
                        logger.error(
                            "siwa-worker: database unavailable; retrying with backoff (at most 2 s apart)",
                            metadata: ["kind": "notification", "error": "\(error)"])
                    }
                    await maintenanceBellFreeSleep(Self.databaseBackoff.delay(afterFailures: failures) + .milliseconds(50))
                } else {
                    logger.error(
                        "siwa-worker notification batch failed", metadata: ["kind": "notification", "error": "\(error)"])
                    await maintenanceBellFreeSleep(policy.delay(afterFailures: min(failures, 5)) + .milliseconds(100))
                }
                continue
            }
            if stopping { break }
            await notificationBell.wait(timeout: retry.wait(after: lastBatch))
        }
    }

    private func record(_ results: [JobQueue.NotificationResult]) {
        guard !results.isEmpty else { return }
        let counters = metrics[.notification]
        counters.claimed.increment(by: results.count { $0.state != "deferred" })
        for result in results {
            switch result.state {
            case "deferred": continue  // still queued; counted in siwa_worker_notifications_deferred_total
            case "completed":
                counters.completed.increment()
                if let delay = result.delaySeconds { metrics.effectDelay.observe(max(0, delay)) }
            case "available":
                counters.retried.increment()
                logger.warning(
                    "siwa-worker notification job failed; retrying",
                    metadata: ["job_id": .int(Int(result.jobID)), "kind": "notification", "error": .string(result.error ?? "")])
            case "discarded":
                counters.discarded.increment()
                logger.error(
                    "siwa-worker notification job discarded",
                    metadata: ["job_id": .int(Int(result.jobID)), "kind": "notification", "error": .string(result.error ?? "")])
            default:
                logger.warning(
                    "siwa-worker lost the lease of a notification job", metadata: ["job_id": .int(Int(result.jobID))])
            }
        }
    }

    // MARK: Apple-calling kinds

    private func dispatchLoop() async {
        await withDiscardingTaskGroup { group in
            while !stopping {
                let free = configuration.concurrency - state.withLock { $0.inFlight.count }
                if free > 0 {
                    do {
                        let jobs = try await queue.claim(
                            worker: configuration.workerID, limit: free, lease: configuration.jobLease)
                        if !jobs.isEmpty {
                            state.withLock { state in for job in jobs { state.inFlight[job.id] = job } }
                            metrics.inFlight.set(Double(state.withLock { $0.inFlight.count }))
                        }
                        for job in jobs {
                            metrics[job.kind].claimed.increment()
                            group.addTask { await self.execute(job) }
                        }
                    } catch {
                        logger.error("siwa-worker claim failed", metadata: ["error": "\(error)"])
                        await maintenanceBellFreeSleep(.seconds(1))
                        continue
                    }
                }
                if stopping { break }
                // A full claim may leave more due jobs: go again as soon as a slot frees (the bell).
                await callBell.wait(timeout: configuration.pollInterval)
            }
            // Shutdown: no more claims; give in-flight jobs the grace period, then hand them back.
            let deadline = ContinuousClock.now + configuration.shutdownGrace
            while state.withLock({ !$0.inFlight.isEmpty }), ContinuousClock.now < deadline {
                try? await Task.sleep(for: .milliseconds(20))
            }
            let leftover = state.withLock { Array($0.inFlight.values) }
            if !leftover.isEmpty {
                let released = (try? await queue.release(leftover)) ?? 0
                logger.warning(
                    "siwa-worker released unfinished jobs at shutdown",
                    metadata: ["count": .int(leftover.count), "released": .int(released)])
                group.cancelAll()
            }
        }
    }

    private func execute(_ job: Job) async {
        let jobLogger = logger.with([
            "job_id": .int(Int(job.id)), "kind": .string(job.kind.rawValue), "client_id": .string(job.clientID),
        ])
        let action: JobAction
        if let handler = handlers[job.kind] {
            let result = await handler.run(job, logger: jobLogger)
            action = JobLifecycle.decide(result, job: job, policy: policy)
        } else {
            jobLogger.error(
                "siwa-worker has no handler for this job kind; snoozing it (never dropped)",
                metadata: ["snooze_seconds": .int(Int(JobLifecycle.unhandledKindSnooze.components.seconds))])
            action = JobLifecycle.unhandled(job)
        }
        do {
            // The handler's work is done (an Apple call may have been made): keep the result through a
            // failover rather than let the lease expire and the call run again. Within the lease the
            // job stays ours; the write is fenced, so repeating it is harmless.
            let recorded = try await retryingConnectionProblems(
                for: configuration.jobLease, operation: "record job result", logger: jobLogger
            ) { try await queue.apply(action, to: job) }
            if recorded {
                metrics.count(action, kind: job.kind)
                switch action {
                case .retry(let error, let delay):
                    jobLogger.warning(
                        "siwa-worker job failed; retrying",
                        metadata: ["error": .string(error), "retry_in_seconds": .double(delay.seconds)])
                case .discard(let error):
                    jobLogger.error("siwa-worker job discarded", metadata: ["error": .string(error)])
                default:
                    jobLogger.debug("siwa-worker job finished")
                }
            } else {
                jobLogger.warning("siwa-worker lost the job's lease; its result is dropped (another run owns it)")
            }
        } catch {
            jobLogger.error("siwa-worker could not record a job's result; its lease will expire", metadata: ["error": "\(error)"])
        }
        let count = state.withLock { state in
            state.inFlight[job.id] = nil
            return state.inFlight.count
        }
        metrics.inFlight.set(Double(count))
        callBell.ring()
    }

    // MARK: Maintenance

    private func maintenanceLoop() async {
        let tick = min(configuration.jobLease / 3, .seconds(5))
        let retentionEvery: Duration = .seconds(300)
        var lastRetention = ContinuousClock.now - retentionEvery + .seconds(10)  // first run soon after start
        while !stopping {
            await maintenanceBell.wait(timeout: tick)
            if stopping { break }
            do {
                let held = state.withLock { Array($0.inFlight.values) }
                if !held.isEmpty { _ = try await queue.extendLeases(held, lease: configuration.jobLease) }
                let rescued = try await queue.rescueExpired()
                for job in rescued where job.state == "discarded" {
                    logger.error(
                        "siwa-worker discarded a job whose process died while running it three times",
                        metadata: ["job_id": .int(Int(job.jobID)), "kind": .string(job.kind), "error": "process_died"])
                }
                if !rescued.isEmpty {
                    logger.warning("siwa-worker rescued jobs whose lease expired", metadata: ["count": .int(rescued.count)])
                    notificationBell.ring()
                    callBell.ring()
                }
                try await refreshQueueGauges()
                if ContinuousClock.now - lastRetention >= retentionEvery {
                    lastRetention = ContinuousClock.now
                    try await retention()
                }
            } catch {
                metrics.databaseReady.set(0)
                logger.warning("siwa-worker maintenance failed", metadata: ["error": "\(error)"])
            }
        }
    }

    /// The queue's health as gauges, so every row of deploy/README.md's "What to alert on" is a series
    /// (deploy/monitoring/siwa-alerts.yml). One pass over the jobs not yet done.
    private func refreshQueueGauges() async throws {
        let backlog = try await pool.withConnection { try await JobQueue.backlog(on: $0) }
        metrics.queueDepth.set(Double(backlog.ready))
        metrics.oldestReadySeconds.set(backlog.oldestReadySeconds ?? 0)
        metrics.oldestPendingRevokeSeconds.set(backlog.oldestPendingRevokeSeconds ?? 0)
        metrics.pausedClients.set(Double(backlog.pausedClients))
        metrics.databaseReady.set(1)
    }

    /// Deletes what outlived its purpose, in one worker at a time.
    private func retention() async throws {
        let retention = Retention(completedJobs: configuration.completedJobRetention, days: configuration.retentionDays)
        if let removed = try await retention.run(on: pool), !removed.isEmpty {
            logger.info(
                "siwa-worker retention",
                metadata: [
                    "jobs": .int(removed.jobs), "notifications": .int(removed.notifications),
                    "rejections": .int(removed.rejections), "account_changes": .int(removed.accountChanges),
                    "discarded_notifications_scrubbed": .int(removed.discardedNotificationsScrubbed),
                ])
        }
    }
}
