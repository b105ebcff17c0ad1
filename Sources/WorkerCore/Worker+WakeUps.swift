import Foundation
import Postgres
import Locking
import Logging
import Webhooks

// The worker's wake-ups: LISTEN siwa_jobs rings the loops' bells (`JobWakeUp`).
extension Worker {
    /// `LISTEN siwa_jobs` on a dedicated connection; each burst of NOTIFYs rings as many notification
    /// loops as it announces batches of notification jobs, and the Apple-calling loop and the
    /// webhook dispatcher when it announces jobs of theirs (`JobWakeUp`).
    func listenLoop() async {
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
    func batchesFor(_ queued: Int) -> Int {
        let batches = (queued + configuration.notificationBatch - 1) / configuration.notificationBatch
        return min(batches, configuration.notificationConnections)
    }

    func maintenanceBellFreeSleep(_ duration: Duration) async {
        let deadline = ContinuousClock.now + duration
        while !stopping, ContinuousClock.now < deadline { try? await Task.sleep(for: .milliseconds(50)) }
    }
}
