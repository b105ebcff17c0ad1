import Foundation
package import Logging
import Postgres
import Synchronization
import Locking
package import Metrics
import SiwaModel

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
///
/// Failures (deploy/README.md, "When the database cannot store"): only a row the database refuses as data (SQLSTATE
/// classes 22 and 23) is the notification's own fault (400); anything else is ours and answered 503
/// so Apple retries. No request waits longer than `commitTimeout`: a watchdog answers 503 for
/// whatever has waited that long, queued or in flight, and the session's `statement_timeout` ends
/// the statement itself.
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
        /// Longest a request waits for its commit, queue included (`SIWA_RECEIVER_COMMIT_TIMEOUT`).
        package var commitTimeout: Duration = .seconds(5)
        package init() {}
    }

    package struct Metrics: Sendable {
        package var commitSeconds: Histogram
        /// From submit to the start of the commit that carries it: time spent behind other commits.
        package var waitSeconds: Histogram
        package var batchSize: Histogram
        package var duplicates: Counter
        package var stored: Counter
        /// Commits that failed for a reason other than the rows themselves (answered 503).
        package var failures: Counter
    }

    /// A request's answer, given at most once: by its committer, or by the watchdog when it waited too long.
    private final class Answer: Sendable {
        private let respond: @Sendable (Outcome) -> Void
        private let given = Atomic<Bool>(false)

        init(_ respond: @escaping @Sendable (Outcome) -> Void) { self.respond = respond }

        func callAsFunction(_ outcome: Outcome) {
            guard !given.exchange(true, ordering: .acquiringAndReleasing) else { return }
            respond(outcome)
        }
    }

    private struct Pending: Sendable {
        var notification: VerifiedNotification
        var answer: Answer
    }

    private typealias Machine = GroupCommitStateMachine<Pending>
    private typealias Queued = Machine.Queued
    private typealias Writability = Machine.Writability

    private struct State {
        /// Every decision of the group commit: the queue, the batches in flight, readiness.
        var machine: Machine
        var rejectionCounts: [String: Int] = [:]
    }

    private let conninfo: String
    private let options: Options
    private let logger: Logger
    private let metrics: Metrics?
    private let state: Locked<State>
    private let wakeUp = NSCondition()
    /// Committers waiting on `wakeUp`. A submit signals only when one is waiting: a busy committer
    /// takes the new item with its next batch, and a futex wake per request is not free.
    private let idleCommitters = Atomic<Int>(0)
    private let stopped = Atomic<Int>(0)
    private let threadsDone = DispatchSemaphore(value: 0)
    private let watchdogDone = DispatchSemaphore(value: 0)

    package init(conninfo: String, options: Options = Options(), logger: Logger, metrics: Metrics? = nil) {
        self.conninfo = conninfo
        self.options = options
        self.logger = logger
        self.metrics = metrics
        state = Locked(State(machine: Machine(options: .init(
            maxBatch: options.maxBatch, maxPending: options.maxPending, reconnectBackoff: options.reconnectBackoff,
            commitTimeout: options.commitTimeout))))
    }

    package func start() {
        state.withLock { $0.machine.start() }
        for index in 0..<options.committers {
            let thread = Thread { [self] in
                commitLoop(index: index)
                threadsDone.signal()
            }
            thread.name = "siwa-commit-\(index)"
            thread.stackSize = 512 * 1024
            thread.start()
        }
        let watchdog = Thread { [self] in
            watchdogLoop()
            watchdogDone.signal()
        }
        watchdog.name = "siwa-commit-watchdog"
        watchdog.stackSize = 256 * 1024
        watchdog.start()
    }

    /// Finishes what is queued, then stops the committers (bounded by `grace`).
    package func stop(grace: Duration = .seconds(10)) {
        state.withLock { $0.machine.stop() }
        wakeUp.lock()
        wakeUp.broadcast()
        wakeUp.unlock()
        let deadline = DispatchTime.now() + .milliseconds(Int(grace.seconds * 1000))
        for _ in 0..<options.committers { _ = threadsDone.wait(timeout: deadline) }
        // Anything still queued or in flight was never answered as committed: say so rather than
        // leave it hanging (an item already answered ignores this).
        let leftovers = state.withLock { $0.machine.leftovers() }
        for item in leftovers { item.answer(.rejected(.shuttingDown)) }
        stopped.store(1, ordering: .releasing)
        _ = watchdogDone.wait(timeout: .now() + .seconds(1))
    }

    /// For `/readyz`: the last commit or connect succeeded and the schema is migrated.
    package var isReady: Bool {
        state.withLock { $0.machine.isReady }
    }

    package var pendingCount: Int { state.withLock { $0.machine.pendingCount } }

    /// Queues one notification; `respond` is called exactly once, from a committer thread (or the
    /// watchdog's, when the commit took longer than `commitTimeout`).
    package func submit(_ notification: VerifiedNotification, respond: @escaping @Sendable (Outcome) -> Void) {
        let answer = Answer(respond)
        let refusal = state.withLock {
            $0.machine.submit(Pending(notification: notification, answer: answer), now: .now)
        }
        if let refusal {
            answer(.rejected(refusal))
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

    // MARK: - Watchdog

    /// Answers 503 for every request that has waited `commitTimeout`, queued or in a commit that
    /// has not come back (a lock, a stalled disk, a network that drops packets silently).
    private func watchdogLoop() {
        let tick = max(Duration.milliseconds(10), min(options.commitTimeout / 20, .milliseconds(100)))
        while stopped.load(ordering: .acquiring) == 0 {
            Thread.sleep(forTimeInterval: tick.seconds)
            let (expired, stuckBatches) = state.withLock { $0.machine.expire(now: .now) }
            guard !expired.isEmpty else { continue }
            if stuckBatches > 0 {
                logger.warning(
                    "commit did not finish within SIWA_RECEIVER_COMMIT_TIMEOUT; answering 503",
                    metadata: ["batch.count": .int(stuckBatches), "requests": .int(expired.count)])
            }
            for item in expired { item.answer(.rejected(.databaseTimeout)) }
        }
    }

    // MARK: - Committer threads

    private func commitLoop(index: Int) {
        // Connect up front so the first notification does not pay for it and /readyz turns green.
        var connection: PostgresConnection? = connect()
        var lastFlush = ContinuousClock.now
        // The last committed batch, not yet answered. Its answers are written while the next
        // batch's INSERT runs, so the database never waits for the committer to write HTTP
        // responses. With nothing queued behind it, it is answered at once.
        var owed: (id: UInt64, items: [Queued])?
        func answerOwed() {
            guard let (id, items) = owed else { return }
            for queued in items { queued.item.answer(.stored) }
            finish(id)
            owed = nil
        }
        while true {
            let batch: [Queued]?
            if owed == nil {
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
                for queued in batch { queued.item.answer(.rejected(.databaseUnavailable)) }
                continue
            }
            if !batch.isEmpty {
                let now = ContinuousClock.now
                metrics?.waitSeconds.observe(contentsOf: batch.lazy.map { (now - $0.queuedAt).seconds })
                let id = register(batch)
                let stored = commit(batch, on: connection, meanwhile: answerOwed)
                if stored.isEmpty { finish(id) } else { owed = (id, stored) }
            }
            // Committer 0 flushes rejection counters and, when idle, proves the database is there.
            if index == 0, ContinuousClock.now - lastFlush > .seconds(5) {
                answerOwed()
                probe(on: connection)
                lastFlush = ContinuousClock.now
            }
        }
        if let connection {
            flushRejections(on: connection)
            connection.close()
        }
    }

    /// Shows `batch` to the watchdog until `finish` (every item answered).
    private func register(_ batch: [Queued]) -> UInt64 {
        state.withLock { $0.machine.commitStarted(batch, now: .now) }
    }

    private func finish(_ id: UInt64) {
        state.withLock { $0.machine.answered(id) }
    }

    /// Waits for work; an empty batch means "idle for a while" (time for housekeeping); nil means stop.
    private func nextBatch() -> [Queued]? {
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
    private func queuedBatch() -> [Queued]? {
        let (batch, running) = takeQueued()
        return batch.isEmpty && !running ? nil : batch
    }

    private func takeQueued() -> (batch: [Queued], running: Bool) {
        state.withLock { $0.machine.takeBatch() }
    }

    /// Opens a session on the writable host: with a multi-host URL and
    /// `target_session_attrs=read-write`, libpq tries each host in turn, so after a failover this finds
    /// the promoted standby. Logs the start and the end of an outage once each, not every retry.
    private func connect() -> PostgresConnection? {
        do {
            // The server bounds every statement too, so a commit the watchdog gave up on ends
            // rather than holding the connection (and its locks) without limit.
            let connection = try PostgresConnection.connectBlocking(
                to: conninfo, applicationName: "siwa-receiver",
                limits: SessionLimits(statementTimeout: options.commitTimeout, lockTimeout: options.commitTimeout),
                logger: logger)
            let writability = checkWritable(on: connection)
            let outageStarted = state.withLock { $0.machine.connected(writability) }
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
            let firstFailure = state.withLock { $0.machine.connectFailed(now: .now) }
            if firstFailure {
                logger.error("database unreachable; answering 503 until it is back", metadata: Self.metadata(error))
            } else {
                logger.debug("database still unreachable", metadata: Self.metadata(error))
            }
            return nil
        }
    }

    /// Whether a commit could succeed now, asked without writing anything: the table exists, this
    /// role may insert into it, and the session may write. /readyz says so before any notification
    /// arrives, and recovers after a failure without needing one.
    private func checkWritable(on connection: PostgresConnection) -> Writability {
        do {
            let rows = try connection.queryBlocking(
                """
                SELECT CASE
                    WHEN to_regclass('siwa.notifications') IS NULL THEN 'unmigrated'
                    WHEN to_regprocedure('siwa.store_notifications(text[], text[], text[], text[], bigint[], text[], text[], text[], text[])') IS NULL
                        THEN 'unmigrated'
                    WHEN NOT has_column_privilege('siwa.notifications', 'jws', 'INSERT')
                        OR NOT has_function_privilege('siwa.store_notifications(text[], text[], text[], text[], bigint[], text[], text[], text[], text[])', 'EXECUTE')
                        THEN 'no_privilege'
                    WHEN pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on' THEN 'read_only'
                    ELSE 'ok' END AS state
                """)
            let answer = try rows.first?.decode(String.self, column: "state") ?? "unknown"
            switch answer {
            case "ok": return .writable
            case "unmigrated":
                logger.error("siwa.notifications does not exist: run `siwa migrate`; /readyz answers 503 until then")
                return .unmigrated
            default:
                logger.error("the database refuses our writes; /readyz answers 503", metadata: ["reason": .string(answer)])
                return .refused
            }
        } catch {
            logger.warning("database readiness check failed", metadata: Self.metadata(error))
            return .refused
        }
    }

    private func insertQuery(_ items: some Collection<Queued>) -> PostgresQuery {
        // One array per column, bound in binary: the statement text stays the same whatever the
        // batch size, and kilobytes of JWS need no escaping.
        var columns = Array(repeating: [String](), count: 8)
        var eventTimes: [Int64] = []
        for index in columns.indices { columns[index].reserveCapacity(items.count) }
        eventTimes.reserveCapacity(items.count)
        for queued in items {
            let verified = queued.item.notification
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
        // `siwa.store_notifications` (sql/functions/notifications.sql): the row count is how many it stored.
        return """
            SELECT FROM siwa.store_notifications(
                \(columns[0])::text[], \(columns[1])::text[], \(columns[2])::text[], \(columns[3])::text[],
                \(eventTimes)::bigint[], \(columns[4])::text[], \(columns[5])::text[], \(columns[6])::text[],
                \(columns[7])::text[])
            """
    }

    /// Commits `batch`, running `meanwhile` while the statement executes. Returns the items
    /// stored, still to be answered; the others have been answered with their rejection.
    private func commit(
        _ batch: [Queued], on connection: PostgresConnection, meanwhile: () -> Void = {}
    ) -> [Queued] {
        let started = ContinuousClock.now
        do {
            let inserted = try connection.executePreparedBlocking(insertQuery(batch), meanwhile: meanwhile)
            recordSuccess(batchSize: batch.count, inserted: inserted, since: started)
            return batch
        } catch where Self.isRowFault(error) {
            // A data error in one row fails the whole statement: retry one by one so only that row is refused.
            logger.warning(
                "batch insert refused a row; isolating rows",
                metadata: Self.metadata(error).merging(["batch.size": .int(batch.count)]) { $1 })
            guard batch.count > 1 else {
                batch[0].item.answer(.rejected(.claimsNotStorable))
                return []
            }
            return batch.flatMap { commit([$0], on: connection) }
        } catch {
            // Not the notification's fault (unreachable, read-only, schema missing, permission,
            // timeout, deadlock, disk full): 503, and Apple retries. When the connection broke the
            // COMMIT's fate is unknown; the retry's jti makes that safe.
            let broken = error.isPostgresConnectionProblem || !connection.isUsable
            logger.error(
                broken ? "database connection lost during commit" : "commit failed; answering 503",
                metadata: Self.metadata(error).merging(["batch.size": .int(batch.count)]) { $1 })
            metrics?.failures.increment()
            let schemaMissing = Self.meansSchemaMissing(error)
            state.withLock { $0.machine.commitFailed(connectionBroken: broken, schemaMissing: schemaMissing, now: .now) }
            for queued in batch { queued.item.answer(.rejected(.databaseUnavailable)) }
            return []
        }
    }

    /// The row itself cannot be stored: SQLSTATE class 22 (data exception) or 23 (integrity
    /// constraint), or a value libpq cannot send. A duplicate `jti` never gets here (ON CONFLICT).
    static func isRowFault(_ error: any Error) -> Bool {
        guard let error = error as? PostgresError else { return false }
        if error.code == .invalidParameter { return true }
        guard error.code == .queryFailed, let sqlState = error.sqlState else { return false }
        return sqlState.hasPrefix("22") || sqlState.hasPrefix("23")
    }

    /// Undefined table, schema, column or function: the database is not (fully) migrated.
    private static func meansSchemaMissing(_ error: any Error) -> Bool {
        guard let sqlState = (error as? PostgresError)?.sqlState else { return false }
        return ["42P01", "3F000", "42703", "42883"].contains(sqlState)
    }

    /// The error's safe description and its SQLSTATE, for logs.
    private static func metadata(_ error: any Error) -> Logger.Metadata {
        var metadata: Logger.Metadata = ["error": "\(error)"]
        if let sqlState = (error as? PostgresError)?.sqlState { metadata["db.sqlstate"] = .string(sqlState) }
        return metadata
    }

    private func recordSuccess(batchSize: Int, inserted: Int, since started: ContinuousClock.Instant) {
        let elapsed = ContinuousClock.now - started
        state.withLock { $0.machine.commitSucceeded() }
        metrics?.commitSeconds.observe(elapsed.seconds)
        metrics?.batchSize.observe(Double(batchSize))
        metrics?.stored.increment(by: inserted)
        metrics?.duplicates.increment(by: batchSize - inserted)
    }

    /// Every few seconds: checks the database is there, migrated and writable, then flushes the
    /// rejection counters. While commits run, their outcome decides readiness; once none has run
    /// for a while (a load balancer stopped sending after /readyz said 503), this check may
    /// restore it, so readiness never waits for traffic that waits for readiness.
    private func probe(on connection: PostgresConnection) {
        let writability = checkWritable(on: connection)
        state.withLock { $0.machine.probed(writability, now: .now) }
        flushRejections(on: connection)
    }

    private func flushRejections(on connection: PostgresConnection) {
        let counts = state.withLock { state in
            defer { state.rejectionCounts.removeAll() }
            return state.rejectionCounts
        }
        guard !counts.isEmpty else { return }
        do {
            let reasons = Array(counts.keys)
            let numbers = reasons.map { Int64(counts[$0]!) }
            // sql/functions/notifications.sql: this minute's counters, added to.
            _ = try connection.executeBlocking("SELECT siwa.count_rejections(\(reasons)::text[], \(numbers)::bigint[])")
        } catch {
            state.withLock { state in
                for (reason, count) in counts { state.rejectionCounts[reason, default: 0] += count }
            }
            logger.debug("rejection counters not flushed", metadata: ["error": "\(error)"])
        }
    }
}
