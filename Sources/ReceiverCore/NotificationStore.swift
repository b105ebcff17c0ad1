import Foundation
package import Logging
import Postgres
package import SiwaCore
import Synchronization
import Locking

/// Stores verified notifications with group commit: concurrent requests share one INSERT, one
/// transaction and one WAL flush, and each is answered only after that COMMIT.
///
/// A few committer threads each own one connection (libpq calls block, and one connection serves
/// one thread at a time). Whatever queued while a commit was in flight becomes the next batch, so
/// batches grow with load on their own and no request waits for a timer.
///
/// The INSERT writes the notification rows; a statement trigger writes their jobs in the same
/// statement, so both commit or neither does. `ON CONFLICT (jti) DO NOTHING` makes a redelivery a
/// no-op that is still answered 200.
package final class NotificationStore: Sendable {
    package enum Outcome: Sendable, Equatable {
        /// Committed now, or already stored (a duplicate `jti`).
        case stored
        case rejected(Rejection)
    }

    package struct Options: Sendable {
        package var committers: Int = 1
        package var maxBatch: Int = 256
        /// Requests waiting for a commit beyond this are shed with 503 rather than queued without bound.
        package var maxPending: Int = 4096
        /// After a failed connect, fail fast for this long instead of stalling every request on it.
        package var reconnectBackoff: Duration = .milliseconds(500)
        package init() {}
    }

    package struct Metrics: Sendable {
        package var commitSeconds: Histogram
        /// From submit to the start of the commit that carries it: time spent behind other commits.
        package var waitSeconds: Histogram
        package var batchSize: Histogram
        package var duplicates: Counter
        package var stored: Counter
    }

    private struct Pending: Sendable {
        var notification: VerifiedNotification
        var respond: @Sendable (Outcome) -> Void
        var queuedAt: ContinuousClock.Instant
    }

    private struct State {
        var queue: [Pending] = []
        /// Until `start()` nothing would ever commit: refuse rather than queue forever.
        var running = false
        var databaseDownUntil: ContinuousClock.Instant?
        /// Since the first failed commit or connect of an outage that is not over yet.
        var outageStarted: ContinuousClock.Instant?
        var lastSuccess: ContinuousClock.Instant?
        var rejectionCounts: [String: Int] = [:]
    }

    private let conninfo: String
    private let options: Options
    private let logger: Logger
    private let metrics: Metrics?
    private let state = Locked(State())
    private let wakeUp = NSCondition()
    /// Committers waiting on `wakeUp`. A submit signals only when one is waiting: a busy committer
    /// takes the new item with its next batch, and a futex wake per request is not free.
    private let idleCommitters = Atomic<Int>(0)
    private let stopped = Atomic<Int>(0)
    private let threadsDone = DispatchSemaphore(value: 0)

    package init(conninfo: String, options: Options = Options(), logger: Logger, metrics: Metrics? = nil) {
        self.conninfo = conninfo
        self.options = options
        self.logger = logger
        self.metrics = metrics
    }

    package func start() {
        state.withLock { $0.running = true }
        for index in 0..<options.committers {
            let thread = Thread { [self] in
                commitLoop(index: index)
                threadsDone.signal()
            }
            thread.name = "siwa-commit-\(index)"
            thread.stackSize = 512 * 1024
            thread.start()
        }
    }

    /// Finishes what is queued, then stops the committers (bounded by `grace`).
    package func stop(grace: Duration = .seconds(10)) {
        state.withLock { $0.running = false }
        wakeUp.lock()
        wakeUp.broadcast()
        wakeUp.unlock()
        let deadline = DispatchTime.now() + .milliseconds(Int(grace.seconds * 1000))
        for _ in 0..<options.committers { _ = threadsDone.wait(timeout: deadline) }
        // Anything still queued was never committed: say so rather than leave it hanging.
        let leftovers = state.withLock { state in
            defer { state.queue.removeAll() }
            return state.queue
        }
        for item in leftovers { item.respond(.rejected(.shuttingDown)) }
    }

    /// Whether a commit succeeded recently (for `/readyz`).
    package var isDatabaseReachable: Bool {
        state.withLock { state in
            guard let last = state.lastSuccess else { return false }
            return ContinuousClock.now - last < .seconds(15)
        }
    }

    package var pendingCount: Int { state.withLock { $0.queue.count } }

    /// Queues one notification; `respond` is called exactly once, from a committer thread.
    package func submit(_ notification: VerifiedNotification, respond: @escaping @Sendable (Outcome) -> Void) {
        let refusal: Rejection? = state.withLock { state in
            guard state.running else { return .shuttingDown }
            if let downUntil = state.databaseDownUntil, ContinuousClock.now < downUntil { return .databaseUnavailable }
            guard state.queue.count < options.maxPending else { return .overloaded }
            state.queue.append(Pending(notification: notification, respond: respond, queuedAt: .now))
            return nil
        }
        if let refusal {
            respond(.rejected(refusal))
            return
        }
        // A committer counts itself idle before it looks at the queue, so either it sees this item
        // or we see it waiting (and wait for the lock it holds until it sleeps).
        if idleCommitters.load(ordering: .sequentiallyConsistent) > 0 {
            wakeUp.lock()
            wakeUp.signal()
            wakeUp.unlock()
        }
    }

    /// Counts a rejected request for `siwa status` (flushed to `siwa.rejections` by a committer).
    package func countRejection(_ rejection: Rejection) {
        state.withLock { $0.rejectionCounts[rejection.code, default: 0] += 1 }
    }

    // MARK: - Committer threads

    private func commitLoop(index: Int) {
        // Connect up front so the first notification does not pay for it and /readyz turns green.
        var connection: PostgresConnection? = connect()
        var lastFlush = ContinuousClock.now
        // The last committed batch, not yet answered. Its answers are written while the next
        // batch's INSERT runs, so the database never waits for the committer to write HTTP
        // responses. With nothing queued behind it, it is answered at once.
        var owed: [Pending] = []
        func answerOwed() {
            for item in owed { item.respond(.stored) }
            owed = []
        }
        while true {
            let batch: [Pending]?
            if owed.isEmpty {
                batch = nextBatch()
            } else {
                batch = queuedBatch()
                if batch?.isEmpty ?? true {
                    answerOwed()
                    continue
                }
            }
            guard let batch else { break }  // stopped and drained
            if connection == nil || connection?.isUsable == false {
                connection?.close()
                connection = connect()
            }
            guard let connection else {
                answerOwed()
                for item in batch { item.respond(.rejected(.databaseUnavailable)) }
                continue
            }
            if !batch.isEmpty {
                let now = ContinuousClock.now
                metrics?.waitSeconds.observe(contentsOf: batch.lazy.map { (now - $0.queuedAt).seconds })
                owed = commit(batch, on: connection, meanwhile: answerOwed)
            }
            // Committer 0 flushes rejection counters and, when idle, proves the database is there.
            if index == 0, ContinuousClock.now - lastFlush > .seconds(5) {
                answerOwed()
                flushRejections(on: connection)
                lastFlush = ContinuousClock.now
            }
        }
        if let connection {
            flushRejections(on: connection)
            connection.close()
        }
    }

    /// Waits for work; an empty batch means "idle for a while" (time for housekeeping); nil means stop.
    private func nextBatch() -> [Pending]? {
        wakeUp.lock()
        idleCommitters.add(1, ordering: .sequentiallyConsistent)
        defer {
            idleCommitters.subtract(1, ordering: .sequentiallyConsistent)
            wakeUp.unlock()
        }
        while true {
            let (batch, running) = takeQueued()
            if !batch.isEmpty { return batch }
            if !running { return nil }
            if !wakeUp.wait(until: Date().addingTimeInterval(5)) { return [] }
        }
    }

    /// What is queued now, without waiting: empty when nothing is, nil when stopped and drained.
    private func queuedBatch() -> [Pending]? {
        let (batch, running) = takeQueued()
        return batch.isEmpty && !running ? nil : batch
    }

    private func takeQueued() -> (batch: [Pending], running: Bool) {
        state.withLock { state in
            let count = min(state.queue.count, options.maxBatch)
            let batch = Array(state.queue.prefix(count))
            state.queue.removeFirst(count)
            return (batch, state.running)
        }
    }

    /// Opens a session on the writable host (with a multi-host URL and
    /// `target_session_attrs=read-write`, libpq tries each host in turn, so after a failover this finds
    /// the promoted standby). Logs the start and the end of an outage once each, not every retry.
    private func connect() -> PostgresConnection? {
        do {
            let connection = try PostgresConnection.connectBlocking(
                to: conninfo, applicationName: "siwa-receiver", logger: logger)
            let outageStarted = state.withLock { state in
                defer { state.outageStarted = nil }
                state.databaseDownUntil = nil
                state.lastSuccess = .now  // a fresh session is proof enough for /readyz
                return state.outageStarted
            }
            if let outageStarted {
                logger.info(
                    "database reachable again; committing",
                    metadata: [
                        "db.server": .string(connection.server),
                        "outage_ms": .int(Int((ContinuousClock.now - outageStarted) / .milliseconds(1))),
                    ])
            }
            return connection
        } catch {
            let firstFailure = state.withLock { state in
                state.databaseDownUntil = ContinuousClock.now + options.reconnectBackoff
                guard state.outageStarted == nil else { return false }
                state.outageStarted = .now
                return true
            }
            if firstFailure {
                logger.error("database unreachable; answering 503 until it is back", metadata: ["error": "\(error)"])
            } else {
                logger.debug("database still unreachable", metadata: ["error": "\(error)"])
            }
            return nil
        }
    }

    private func insertQuery(_ items: some Collection<Pending>) -> PostgresQuery {
        // One array per column, bound in binary: the statement text stays the same whatever the
        // batch size, and kilobytes of JWS need no escaping.
        var columns = Array(repeating: [String](), count: 8)
        var eventTimes: [Int64] = []
        for index in columns.indices { columns[index].reserveCapacity(items.count) }
        eventTimes.reserveCapacity(items.count)
        for item in items {
            let verified = item.notification
            let event = verified.notification.event
            columns[0].append(verified.notification.jti)
            columns[1].append(verified.clientID)
            columns[2].append(event.sub)
            columns[3].append(event.type.rawValue)
            eventTimes.append(Int64((event.time.timeIntervalSince1970 * 1000).rounded()))  // milliseconds
            columns[4].append(event.email ?? "")
            columns[5].append(event.isPrivateEmail.map { $0 ? "t" : "f" } ?? "")
            columns[6].append(verified.claimsJSON)
            columns[7].append(verified.jws)
        }
        return """
            INSERT INTO siwa.notifications
                (jti, client_id, sub, event_type, event_time, email, is_private_email, claims, jws)
            SELECT jti, client_id, sub, event_type, to_timestamp(event_time::float8 / 1000), nullif(email, ''),
                   nullif(private, '')::boolean, claims::jsonb, jws
              FROM unnest(\(columns[0])::text[], \(columns[1])::text[], \(columns[2])::text[], \(columns[3])::text[],
                          \(eventTimes)::bigint[], \(columns[4])::text[], \(columns[5])::text[], \(columns[6])::text[],
                          \(columns[7])::text[])
                AS t(jti, client_id, sub, event_type, event_time, email, private, claims, jws)
            ON CONFLICT (jti) DO NOTHING
            """
    }

    /// Commits `batch`, running `meanwhile` while the statement executes. Returns the items
    /// stored, still to be answered; the others have been answered with their rejection.
    private func commit(
        _ batch: [Pending], on connection: PostgresConnection, meanwhile: () -> Void = {}
    ) -> [Pending] {
        let started = ContinuousClock.now
        do {
            let inserted = try connection.executePreparedBlocking(insertQuery(batch), meanwhile: meanwhile)
            recordSuccess(batchSize: batch.count, inserted: inserted, since: started)
            return batch
        } catch let error as PostgresError where error.isConnectionProblem || !connection.isUsable {
            // The COMMIT's fate is unknown; 503 makes the sender retry, and the jti makes that safe.
            logger.error("database connection lost during commit", metadata: ["error": "\(error)"])
            state.withLock { state in
                state.databaseDownUntil = ContinuousClock.now + options.reconnectBackoff
                if state.outageStarted == nil { state.outageStarted = .now }
            }
            for item in batch { item.respond(.rejected(.databaseUnavailable)) }
            return []
        } catch {
            // A data error in one row fails the whole statement: retry one by one so only that row is refused.
            logger.warning("batch insert failed; isolating rows", metadata: ["error": "\(error)", "batch.size": .int(batch.count)])
            guard batch.count > 1 else {
                batch[0].respond(.rejected(Rejection(status: 400, code: "claims_not_storable")))
                return []
            }
            return batch.flatMap { commit([$0], on: connection) }
        }
    }

    private func recordSuccess(batchSize: Int, inserted: Int, since started: ContinuousClock.Instant) {
        let elapsed = ContinuousClock.now - started
        state.withLock { $0.lastSuccess = .now }
        metrics?.commitSeconds.observe(elapsed.seconds)
        metrics?.batchSize.observe(Double(batchSize))
        metrics?.stored.increment(by: inserted)
        metrics?.duplicates.increment(by: batchSize - inserted)
    }

    private func flushRejections(on connection: PostgresConnection) {
        let counts = state.withLock { state in
            defer { state.rejectionCounts.removeAll() }
            return state.rejectionCounts
        }
        do {
            _ = try connection.executeBlocking("SELECT 1")
            state.withLock { $0.lastSuccess = .now }
            guard !counts.isEmpty else { return }
            let reasons = Array(counts.keys)
            let numbers = reasons.map { Int64(counts[$0]!) }
            _ = try connection.executeBlocking(
                """
                INSERT INTO siwa.rejections (minute, reason, count)
                SELECT date_trunc('minute', now()), reason, n FROM unnest(\(reasons)::text[], \(numbers)::bigint[]) AS t(reason, n)
                ON CONFLICT (minute, reason) DO UPDATE SET count = siwa.rejections.count + excluded.count
                """)
        } catch {
            state.withLock { state in
                for (reason, count) in counts { state.rejectionCounts[reason, default: 0] += count }
            }
            logger.debug("rejection counters not flushed", metadata: ["error": "\(error)"])
        }
    }
}
