/// The decisions of the receiver's group commit, without threads, connections or clocks: what is
/// queued, what the next batch is, which requests waited too long, whether the store is ready.
/// `NotificationStore` holds one behind its lock, feeds it what happened (a request arrived, a batch
/// was taken, a commit finished or failed, a connect failed, the watchdog's tick, stop) with the
/// time, and does what the answers say: commit a batch, answer requests, log an outage once.
/// Tested step by step in `GroupCommitStateMachineTests`, with time given, not waited for.
package struct GroupCommitStateMachine<Item> {
    package struct Options: Sendable {
        package var maxBatch: Int
        /// Requests waiting for a commit beyond this are refused rather than queued without bound.
        package var maxPending: Int
        /// After a failed connect or a broken connection, refuse for this long instead of queueing
        /// requests behind a database that is not there.
        package var reconnectBackoff: Duration
        /// Longest a request waits for its answer, queue included.
        package var commitTimeout: Duration

        package init(maxBatch: Int, maxPending: Int, reconnectBackoff: Duration, commitTimeout: Duration) {
            self.maxBatch = maxBatch
            self.maxPending = maxPending
            self.reconnectBackoff = reconnectBackoff
            self.commitTimeout = commitTimeout
        }
    }

    /// A request in the queue or in a commit.
    package struct Queued {
        package var item: Item
        package var queuedAt: ContinuousClock.Instant
    }

    /// What a connection found when it asked whether a commit could succeed.
    package enum Writability: Sendable, Equatable {
        case writable
        /// `siwa.notifications` does not exist: `siwa migrate` has not run.
        case unmigrated
        /// Read-only (a standby, `default_transaction_read_only`) or no INSERT privilege.
        case refused
    }

    /// A batch a committer took, until every item is answered (the watchdog's view of it).
    private struct InFlight {
        var items: [Queued]
        var oldest: ContinuousClock.Instant
    }

    package let options: Options
    private var queue: [Queued] = []
    /// Until `start()` nothing would ever commit: refuse rather than queue forever.
    private var running = false
    private var databaseDownUntil: ContinuousClock.Instant?
    /// Since the first failed commit or connect of an outage that is not over yet.
    private var outageStarted: ContinuousClock.Instant?
    /// The last commit or connect succeeded (false from the first failure until the next success).
    private var healthy = false
    /// `siwa.notifications` exists (checked at connect and by the idle probe).
    private var schemaReady = false
    /// When a commit last started (the idle probe leaves readiness to commits while they run).
    private var lastCommitAt: ContinuousClock.Instant?
    /// Commits started and not yet returned, including those the watchdog gave up on: one blocked
    /// on a lock is still in the database, and no idle probe may call the store ready meanwhile.
    private var committing: Set<UInt64> = []
    private var inFlight: [UInt64: InFlight] = [:]
    private var nextBatchID: UInt64 = 0

    package init(options: Options) {
        self.options = options
    }

    /// For `/readyz`: the last commit or connect succeeded and the schema is migrated.
    package var isReady: Bool { healthy && schemaReady }

    package var pendingCount: Int { queue.count }

    package mutating func start() { running = true }

    // MARK: Requests

    /// A verified request arrived: queued (nil), or refused now with the reason.
    package mutating func submit(_ item: Item, now: ContinuousClock.Instant) -> Rejection? {
        guard running else { return .shuttingDown }
        if let downUntil = databaseDownUntil, now < downUntil { return .databaseUnavailable }
        guard queue.count < options.maxPending else { return .overloaded }
        queue.append(Queued(item: item, queuedAt: now))
        return nil
    }

    /// A committer asks for work: up to `maxBatch` of what is queued, oldest first (empty when
    /// nothing is), and whether to go on (false once stopped: then only the rest is drained).
    package mutating func takeBatch() -> (batch: [Queued], running: Bool) {
        let count = min(queue.count, options.maxBatch)
        let batch = Array(queue.prefix(count))
        queue.removeFirst(count)
        return (batch, running)
    }

    /// The committer starts committing `batch`: shown to the watchdog until `answered(_:)`.
    package mutating func commitStarted(_ batch: [Queued], now: ContinuousClock.Instant) -> UInt64 {
        nextBatchID &+= 1
        lastCommitAt = now
        committing.insert(nextBatchID)
        inFlight[nextBatchID] = InFlight(items: batch, oldest: batch.lazy.map(\.queuedAt).min() ?? now)
        return nextBatchID
    }

    /// Every item of the batch has its answer (or the watchdog gave them one already).
    package mutating func answered(_ batch: UInt64) {
        inFlight[batch] = nil
        committing.remove(batch)
    }

    // MARK: The database

    package mutating func commitSucceeded() {
        healthy = true
    }

    /// A commit failed for a reason other than its rows (answered 503). A broken connection also
    /// starts the reconnect backoff and, if none is running, an outage.
    package mutating func commitFailed(connectionBroken: Bool, schemaMissing: Bool, now: ContinuousClock.Instant) {
        healthy = false
        if connectionBroken {
            databaseDownUntil = now + options.reconnectBackoff
            if outageStarted == nil { outageStarted = now }
        }
        if schemaMissing { schemaReady = false }
    }

    /// A connect failed. Returns true for the first failure of an outage (log it once).
    package mutating func connectFailed(now: ContinuousClock.Instant) -> Bool {
        databaseDownUntil = now + options.reconnectBackoff
        healthy = false
        guard outageStarted == nil else { return false }
        outageStarted = now
        return true
    }

    /// A connect succeeded and found `writability`. Returns when the outage it ends began (log its
    /// length once), nil when there was none or the database still refuses writes.
    package mutating func connected(_ writability: Writability) -> ContinuousClock.Instant? {
        databaseDownUntil = nil
        healthy = writability == .writable
        schemaReady = writability != .unmigrated
        guard writability == .writable else { return nil }
        defer { outageStarted = nil }
        return outageStarted
    }

    /// The idle probe found `writability`. While commits run their outcome decides readiness; once
    /// none has started for five seconds, a writable database makes the store ready again, so
    /// readiness never waits for traffic that waits for readiness.
    package mutating func probed(_ writability: Writability, now: ContinuousClock.Instant) {
        schemaReady = writability != .unmigrated
        if writability != .writable {
            healthy = false
        } else if committing.isEmpty, lastCommitAt.map({ now - $0 > .seconds(5) }) ?? true {
            healthy = true
        }
    }

    // MARK: Time and stop

    /// The watchdog's tick: every request that has waited `commitTimeout`, queued or in a commit
    /// that has not come back, is taken out to be answered 503. `stuckBatches` counts the commits
    /// given up on (the store is then not ready until a commit or connect succeeds).
    package mutating func expire(now: ContinuousClock.Instant) -> (expired: [Item], stuckBatches: Int) {
        let cutoff = now - options.commitTimeout
        var expired: [Item] = []
        // The queue is in arrival order: the expired ones are at its front.
        let count = queue.prefix { $0.queuedAt <= cutoff }.count
        if count > 0 {
            expired = queue.prefix(count).map(\.item)
            queue.removeFirst(count)
        }
        var stuck = 0
        for (id, batch) in inFlight where batch.oldest <= cutoff {
            expired += batch.items.map(\.item)
            inFlight[id] = nil
            stuck += 1
        }
        if stuck > 0 { healthy = false }
        return (expired, stuck)
    }

    /// No new requests from now on; committers drain what is queued.
    package mutating func stop() {
        running = false
    }

    /// After the committers stopped: whatever is still queued or in flight, to be refused (an item
    /// already answered ignores a second answer).
    package mutating func leftovers() -> [Item] {
        defer {
            queue.removeAll()
            inFlight.removeAll()
        }
        return queue.map(\.item) + inFlight.values.flatMap { $0.items.map(\.item) }
    }
}
