import JobQueue
import Postgres
import Locking
import Logging
import Metrics

// The worker's notification loops (the hot path): batches of notification jobs, verified and applied.
extension Worker {
    /// One batch with the held jobs first, in one transaction of two round trips, written here
    /// (the queue only provides the statements, and calls nothing back): BEGIN travels with the
    /// read of up to `limit` held jobs (`JobQueue.heldNotificationsQuery`, locked SKIP LOCKED), the
    /// gate judges them (and records the forged ones in the same transaction), and the batch
    /// (`JobQueue.notificationBatchQuery`), which takes the genuine ones before any due job,
    /// travels with COMMIT. A rollback leaves them held. If any job raises, the batch runs again
    /// with one subtransaction per job, so the verdicts returned are those of the transaction that
    /// committed. `skipBusyAccounts`: take only jobs (held and due) of users no other batch is taking.
    /// `previous`: how many jobs the loop's last batch took. Before a batch far larger than the
    /// session's plans were made for, the session makes them again (`SessionPlans`).
    func verifiedNotificationBatch(
        limit: Int, skipBusyAccounts: Bool, previous: Int = 0
    ) async throws -> (results: [JobQueue.NotificationResult], held: StoredNotificationGate.HeldVerdicts) {
        let (gate, metrics, configuration, policy, state, logger) = (gate, metrics, configuration, policy, state, logger)
        return try await pool.withConnection { connection in
            let session = SessionPlans.Session(connection)
            func run(isolate: Bool) async throws -> (results: [JobQueue.NotificationResult], held: StoredNotificationGate.HeldVerdicts) {
                var verdicts = StoredNotificationGate.HeldVerdicts()
                let rows = try await connection.withTransaction(
                    opening: JobQueue.heldNotificationsQuery(limit: limit, skipBusyAccounts: skipBusyAccounts)
                ) { connection, heldRows in
                    let started = ContinuousClock.now
                    verdicts = try await gate.verifyHeld(heldRows, on: connection)
                    metrics.verifySeconds.observe((ContinuousClock.now - started).seconds)
                    let expected = min(limit, max(heldRows.count, previous))
                    if state.withLock({ $0.sessionPlans.shouldRefresh(session, before: expected, at: .now) }) {
                        try await connection.simpleQuery(SessionPlans.refreshSQL)
                        metrics.planRefreshes.increment()
                        logger.debug(
                            "siwa-worker: the session's plans are made again for larger batches",
                            metadata: ["batch": .int(expected), "backend_pid": .int(Int(session.backendPID))])
                    }
                    return JobQueue.notificationBatchQuery(
                        worker: configuration.workerID, limit: limit, lease: configuration.jobLease, policy: policy,
                        isolate: isolate, verified: verdicts.genuine, skipBusyAccounts: skipBusyAccounts)
                }
                return (try JobQueue.notificationResults(rows), verdicts)
            }
            let outcome: (results: [JobQueue.NotificationResult], held: StoredNotificationGate.HeldVerdicts)
            do {
                outcome = try await run(isolate: false)
            } catch let error as PostgresError where error.code == .queryFailed {
                outcome = try await run(isolate: true)
            }
            let taken = outcome.results.count { $0.state != "deferred" }
            state.withLock { $0.sessionPlans.record(session, taken: taken) }
            return outcome
        }
    }

    /// One of `notificationConnections` loops. A loop that claimed a full batch rings the bell
    /// before going on, so an idle loop joins in while a backlog lasts; a trickle wakes one loop.
    ///
    /// The batch size adapts to contention (`NotificationBatchLimit`).
    func notificationLoop() async {
        var limit = NotificationBatchLimit(largest: configuration.notificationBatch)
        var retry = DeferredRetry(pollInterval: configuration.pollInterval)
        var lastBatch = Duration.zero
        var previousTaken = 0
        var failures = 0
        while !stopping {
            do {
                var again = false
                repeat {
                    let started = ContinuousClock.now
                    let skipBusyAccounts = state.withLock { $0.busyAccounts.isActive(at: started) }
                    let (results, held) = try await verifiedNotificationBatch(
                        limit: limit.value, skipBusyAccounts: skipBusyAccounts, previous: previousTaken)
                    lastBatch = ContinuousClock.now - started
                    metrics.batchSeconds.observe(lastBatch.seconds)
                    gate.report(held)
                    let deferred = results.count { $0.state == "deferred" }
                    let taken = results.count - deferred
                    previousTaken = taken
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

    func record(_ results: [JobQueue.NotificationResult]) {
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
}
