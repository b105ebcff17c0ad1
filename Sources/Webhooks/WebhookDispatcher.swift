internal import Foundation
package import JobQueue
package import Logging
package import Postgres
import Locking
package import Metrics

/// Delivers account changes to the app's webhook: registers the endpoint (so the database queues a
/// delivery per change), claims each account's oldest undelivered change, sends it signed, and
/// records the result, up to `settings.concurrency` requests in flight.
///
/// Each request holds one slot until it is answered, so a slow or failing account takes one slot,
/// never the others'. The slot is free before the result is written: the account's next change
/// stays unclaimable until then anyway (its delivery is `running` in the database), and the next
/// request need not wait for a commit. Claimed deliveries whose result is not written yet are
/// capped at twice the slots. Results are written in batches by one writer (one round trip and one
/// commit for whatever finished meanwhile); a result that cannot be written (database down) stays
/// buffered and is written when it comes back, its lease kept alive meanwhile.
/// `run()` returns after `stop()`: no more claims, in-flight deliveries get the grace period, the
/// rest are handed back.
package final class WebhookDispatcher: Sendable {
    package struct Options: Sendable {
        package var workerID: String
        package var lease: Duration
        package var pollInterval: Duration
        package var shutdownGrace: Duration
        package var retryPolicy: RetryPolicy
        /// The worker's session bounds (`SIWA_WORKER_STATEMENT_TIMEOUT`): no claim or write hangs.
        package var limits: SessionLimits

        package init(
            workerID: String, lease: Duration, pollInterval: Duration, shutdownGrace: Duration, retryPolicy: RetryPolicy,
            limits: SessionLimits = .none
        ) {
            self.workerID = workerID
            self.lease = lease
            self.pollInterval = pollInterval
            self.shutdownGrace = shutdownGrace
            self.retryPolicy = retryPolicy
            self.limits = limits
        }
    }

    private struct Finished: Sendable {
        var delivery: WebhookQueue.Delivery
        var attempt: WebhookQueue.Attempt
        var result: WebhookAttemptResult?
        var answeredAt: Date
    }

    private struct State {
        var stopping = false
        /// No more results will be written (after the grace period).
        var closed = false
        /// Claimed and not yet written, by job id: the leases to keep alive.
        var held: [Int64: WebhookQueue.Delivery] = [:]
        /// Requests not answered yet: the slots in use.
        var sending = 0
        /// The last claim filled every free slot, so more may be due and a freed slot is worth a claim.
        /// Otherwise only a written result (the account's next change), a NOTIFY or the poll can
        /// bring due work: an answer alone does not, and claiming on it would cost a round trip each.
        var moreDue = false
        var finished: [Finished] = []
    }

    private let settings: WebhookSettings
    private let options: Options
    private let queue: WebhookQueue
    private let pool: PostgresPool
    private let client: WebhookClient
    private let metrics: WebhookMetrics
    private let logger: Logger
    private let state = Locked(State())
    private let claimBell = Doorbell()
    private let writeBell = Doorbell()
    private let maintenanceBell = Doorbell()

    package init(settings: WebhookSettings, databaseURL: String, options: Options, registry: MetricsRegistry, logger: Logger) {
        self.settings = settings
        self.options = options
        self.logger = logger.with(["component": "webhooks"])
        pool = PostgresPool(
            conninfo: databaseURL, size: 3, acquireTimeout: .seconds(10), applicationName: "siwa-worker-webhooks",
            limits: options.limits, logger: logger)
        queue = WebhookQueue(pool: pool)
        client = WebhookClient(url: settings.url, timeout: settings.timeout, caCertificates: settings.caCertificates)
        metrics = WebhookMetrics(registry: registry)
    }

    /// New jobs may be due (NOTIFY siwa_jobs).
    package func wake() { claimBell.ring() }

    /// Begins the graceful shutdown; `run()` returns once it is done.
    package func stop() {
        state.withLock { $0.stopping = true }
        claimBell.ring()
        writeBell.ring()
        maintenanceBell.ring()
    }

    private var stopping: Bool { state.withLock { $0.stopping } }

    package func run() async {
        await register()
        await withDiscardingTaskGroup { group in
            group.addTask { await self.writeLoop() }
            group.addTask { await self.maintenanceLoop() }
            await claimLoop(group: &group)
            // Shutdown: in-flight deliveries get the grace period to be answered and written.
            let deadline = ContinuousClock.now + options.shutdownGrace
            while state.withLock({ !$0.held.isEmpty }), ContinuousClock.now < deadline {
                try? await Task.sleep(for: .milliseconds(20))
            }
            let leftover = state.withLock { state -> [WebhookQueue.Delivery] in
                state.closed = true
                return Array(state.held.values)
            }
            writeBell.ring()
            maintenanceBell.ring()
            if !leftover.isEmpty {
                let released = (try? await queue.release(leftover)) ?? 0
                logger.warning(
                    "siwa-worker handed unfinished webhook deliveries back at shutdown",
                    metadata: ["count": .int(leftover.count), "released": .int(released)])
                group.cancelAll()
            }
        }
        pool.close()
    }

    /// Until the database knows the endpoint, changes are not queued: retried until it works.
    private func register() async {
        var failures = 0
        while !stopping {
            do {
                try await queue.register(endpoint: settings.endpoint)
                logger.info("siwa-worker webhooks registered; every account change is now queued for delivery")
                return
            } catch {
                failures += 1
                logger.error("siwa-worker could not register the webhook endpoint; retrying", metadata: ["error": "\(error)"])
                await pause(options.retryPolicy.delay(afterFailures: min(failures, 5)) + .milliseconds(200))
            }
        }
    }

    // MARK: Claiming and sending

    private func claimLoop(group: inout DiscardingTaskGroup) async {
        var failures = 0
        // With requests in flight, claim only once a quarter of the slots is free: one claim
        // (and one result write) then carries many deliveries, instead of each freed slot costing
        // a round trip of its own.
        let refill = max(1, settings.concurrency / 4)
        while !stopping {
            let (sending, held) = state.withLock { ($0.sending, $0.held.count) }
            let free = min(settings.concurrency - sending, 2 * settings.concurrency - held)
            if free > 0, sending == 0 || free >= refill {
                do {
                    let deliveries = try await queue.claim(worker: options.workerID, limit: free, lease: options.lease)
                    failures = 0
                    let count = state.withLock { state in
                        for delivery in deliveries { state.held[delivery.jobID] = delivery }
                        state.sending += deliveries.count
                        state.moreDue = deliveries.count == free
                        return state.sending
                    }
                    if !deliveries.isEmpty {
                        metrics.inFlight.set(Double(count))
                        for delivery in deliveries { group.addTask { await self.send(delivery) } }
                        if deliveries.count == free { continue }  // maybe more due: claim again once a slot frees
                    }
                } catch {
                    failures += 1
                    logger.error("siwa-worker webhook claim failed", metadata: ["error": "\(error)"])
                    await pause(options.retryPolicy.delay(afterFailures: min(failures, 5)) + .milliseconds(100))
                    continue
                }
            }
            if stopping { break }
            await claimBell.wait(timeout: options.pollInterval)
        }
    }

    private func send(_ delivery: WebhookQueue.Delivery) async {
        let started = ContinuousClock.now
        guard let body = delivery.body, let changeID = delivery.changeID else {
            // The change row is gone (deleted by hand): nothing to send, nothing to hold back.
            enqueue(Finished(delivery: delivery, attempt: .changeMissing, result: nil, answeredAt: Date()))
            return
        }
        let bytes = Array(body.utf8)
        let timestamp = Int64(Date().timeIntervalSince1970)
        let headers = WebhookSignature.headers(id: String(changeID), timestamp: timestamp, body: bytes, secret: settings.secret)
        let result = await client.send(body: bytes, headers: headers)
        let elapsed = ContinuousClock.now - started
        metrics.requestDuration.observe(elapsed.seconds)
        // Only the report: whether it is delivered, retried or discarded is the database's rule
        // (siwa.webhook_retry, on its own clock), decided as the result is written.
        let attempt: WebhookQueue.Attempt
        switch result {
        case .answered(let status, _): attempt = .answered(status: status, error: result.errorText)
        case .timedOut, .connectionFailed: attempt = .failed(error: result.errorText)
        }
        enqueue(Finished(delivery: delivery, attempt: attempt, result: result, answeredAt: Date()))
    }

    /// The answer is in: the slot is free (the claim loop may fill it) and the result waits for the writer.
    private func enqueue(_ finished: Finished) {
        let (sending, moreDue) = state.withLock { state in
            state.finished.append(finished)
            state.sending -= 1
            return (state.sending, state.moreDue)
        }
        metrics.inFlight.set(Double(sending))
        writeBell.ring()
        if moreDue { claimBell.ring() }
    }

    // MARK: Writing results

    private func writeLoop() async {
        var failures = 0
        while true {
            var (batch, closed, sending) = takeFinished()
            if batch.isEmpty {
                if closed { return }
                await writeBell.wait(timeout: .milliseconds(250))
                continue
            }
            if sending > 0 {
                // Others of the same claim are about to answer: one write for them all (2 ms at most).
                await writeBell.wait(timeout: .milliseconds(2))
                let more = takeFinished()
                batch += more.batch
                closed = more.closed
            }
            do {
                let states = try await queue.finish(
                    batch.map { ($0.delivery, $0.attempt) }, window: settings.retryWindow, policy: options.retryPolicy)
                failures = 0
                record(batch, states: states)
            } catch {
                // Kept and written again: a delivery answered 2xx must not be sent twice because its
                // result could not be recorded once. Its lease stays alive meanwhile (maintenance).
                failures += 1
                logger.error(
                    "siwa-worker could not record webhook results; retrying",
                    metadata: ["count": .int(batch.count), "error": "\(error)"])
                let giveUp = state.withLock { state -> Bool in
                    if state.closed { return true }
                    state.finished.insert(contentsOf: batch, at: 0)
                    return false
                }
                if giveUp { return }  // shutdown: the leases expire and the deliveries run again
                await sleepUnlessClosed(options.retryPolicy.delay(afterFailures: min(failures, 4)) + .milliseconds(100))
            }
        }
    }

    /// The results waiting to be written, whether the dispatcher is closed, and how many
    /// deliveries are still being sent.
    private func takeFinished() -> (batch: [Finished], closed: Bool, sending: Int) {
        state.withLock { state in
            let batch = state.finished
            state.finished = []
            return (batch, state.closed, state.sending)
        }
    }

    private func record(_ batch: [Finished], states: [Int64: WebhookQueue.Written]) {
        state.withLock { state in
            for item in batch { state.held[item.delivery.jobID] = nil }
        }
        claimBell.ring()  // the accounts' next changes are claimable now, and the cap on unwritten results has room
        for item in batch {
            let delivery = item.delivery
            if let reason = item.result?.failureReason { metrics.failures[reason]?.increment() }
            var metadata: Logger.Metadata = [
                "job_id": .int(Int(delivery.jobID)), "change_id": .int(Int(delivery.changeID ?? 0)),
                "attempt": .int(delivery.attempt),
            ]
            guard let written = states[delivery.jobID] else {
                logger.warning("siwa-worker lost a webhook delivery's lease; its result is dropped", metadata: metadata)
                continue
            }
            if written.state != "completed", let result = item.result { metadata["error"] = .string(result.errorText) }
            switch written.state {
            case "completed":
                metrics.delivered.increment()
                if let created = delivery.changeCreatedAt {
                    metrics.deliveryDelay.observe(max(0, item.answeredAt.timeIntervalSince(created)))
                }
            case "available":
                metadata["retry_in_seconds"] = .double(written.retryIn ?? 0)
                logger.warning("siwa-worker webhook delivery failed; retrying", metadata: metadata)
            case "discarded":
                metrics.discarded.increment()
                logger.error(
                    "siwa-worker webhook delivery discarded after its retry window; the account's later changes wait "
                        + "(siwa jobs retry ID)", metadata: metadata)
            default:
                break
            }
        }
    }

    // MARK: Leases, registration, gauges

    private func maintenanceLoop() async {
        let tick = min(options.lease / 3, .seconds(5))
        var lastTouch = ContinuousClock.now
        while state.withLock({ !$0.closed }) {
            await maintenanceBell.wait(timeout: tick)
            if state.withLock({ $0.closed }) { return }
            do {
                let held = state.withLock { Array($0.held.values) }
                try await queue.extendLeases(held, lease: options.lease)
                if ContinuousClock.now - lastTouch >= .seconds(30), !stopping {
                    lastTouch = ContinuousClock.now
                    try await queue.touch()
                }
                let backlog = try await pool.withConnection { try await WebhookQueue.backlog(on: $0) }
                metrics.undelivered.set(Double(backlog.undelivered))
                metrics.oldestUndelivered.set(backlog.oldestSeconds ?? 0)
                metrics.discardedKept.set(Double(backlog.discarded))
            } catch {
                logger.warning("siwa-worker webhook maintenance failed", metadata: ["error": "\(error)"])
            }
        }
    }

    /// Sleeps up to `duration`, returning early once stopping (claims and registration give up).
    private func pause(_ duration: Duration) async {
        let deadline = ContinuousClock.now + duration
        while ContinuousClock.now < deadline, !stopping { try? await Task.sleep(for: .milliseconds(20)) }
    }

    /// Sleeps up to `duration`, returning early once closed (result writes go on through the grace period).
    private func sleepUnlessClosed(_ duration: Duration) async {
        let deadline = ContinuousClock.now + duration
        while ContinuousClock.now < deadline, !state.withLock({ $0.closed }) {
            try? await Task.sleep(for: .milliseconds(20))
        }
    }
}
