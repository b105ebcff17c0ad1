import JobQueue
import Postgres
import Locking
import Logging
import Metrics

// The worker's maintenance: leases kept alive, expired ones rescued, queue gauges, retention.
extension Worker {
    func maintenanceLoop() async {
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
    func refreshQueueGauges() async throws {
        let backlog = try await pool.withConnection { try await JobQueue.backlog(on: $0) }
        metrics.queueDepth.set(Double(backlog.ready))
        metrics.oldestReadySeconds.set(backlog.oldestReadySeconds ?? 0)
        metrics.oldestPendingRevokeSeconds.set(backlog.oldestPendingRevokeSeconds ?? 0)
        metrics.pausedClients.set(Double(backlog.pausedClients))
        metrics.databaseReady.set(1)
    }

    /// Deletes what outlived its purpose, in one worker at a time.
    func retention() async throws {
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
