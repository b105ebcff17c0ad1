/// How many jobs a notification loop asks for next (`Worker.notificationLoop`).
///
/// A batch that had to leave jobs queued because another transaction held their accounts
/// (`deferred`) halves the limit, down to a sixteenth of SIWA_NOTIFICATION_BATCH; a full batch
/// without any grows it back by that sixteenth. Batches over disjoint accounts (unseen subs, most
/// linked ones) stay large, for throughput; batches over a few hot accounts shrink until concurrent
/// ones stop overlapping, instead of queueing on row locks, and stay near that size: growing back
/// by doubling overshot at once and deferred again (mix (c) of deploy/bench/worker.sh: 5,400-6,300
/// of 20,000 jobs deferred doubling, 3,000-5,000 growing by steps).
package struct NotificationBatchLimit: Sendable, Equatable {
    package let largest: Int
    package let step: Int
    package private(set) var value: Int

    package init(largest: Int) {
        self.largest = largest
        step = max(1, largest / 16)
        value = largest
    }

    /// After a batch that took `taken` jobs and deferred `deferred`.
    package mutating func record(taken: Int, deferred: Int) {
        if deferred > 0 {
            value = max(step, value / 2)
        } else if taken == value {
            value = min(largest, value + step)
        }
    }
}

/// How long a notification loop whose batch left jobs queued (their account held by another
/// transaction) waits before trying again, unless its process's bell rings first.
///
/// The bell rings when a batch of the same process finishes; nothing tells the loop when a batch
/// of another worker process, or an app transaction, lets the account go (releasing a deferred job
/// queues no NOTIFY). So it tries again after about as long as its own batch took (the holder is
/// most likely a batch like it), doubling while the account stays busy (an app transaction that
/// holds it for long is not polled hard), and never later than the poll interval or 2 s. Before,
/// it waited for the poll interval (1 s): with two worker processes on hot accounts, a process whose
/// loops had both deferred sat idle while the other worked (mix (c) of deploy/bench/worker.sh).
package struct DeferredRetry: Sendable, Equatable {
    package let pollInterval: Duration
    /// Batches in a row that deferred jobs.
    package private(set) var streak = 0

    package init(pollInterval: Duration) {
        self.pollInterval = pollInterval
    }

    package mutating func record(deferred: Int) {
        streak = deferred > 0 ? streak + 1 : 0
    }

    /// The longest a loop waits after deferring, whatever the poll interval: once the holder lets
    /// go, a deferred job is tried again within this. (With a long poll interval the doubling
    /// alone grew past the 30 s a test allowed, when the account had been held for 20 s.)
    package static let longestWait = Duration.seconds(2)

    /// The longest wait for the bell after a batch that took `batch`.
    package func wait(after batch: Duration) -> Duration {
        guard streak > 0 else { return pollInterval }
        let first = max(batch, .milliseconds(1))
        return min(pollInterval, Self.longestWait, first * (1 << min(streak - 1, 20)))
    }
}

/// Whether this process's notification batches read only held jobs of users no other batch is
/// taking (`siwa.held_notification_jobs`, p_skip_busy_accounts): from a batch that had to leave
/// jobs queued because their account was busy until `window` has passed without another.
///
/// Skipping costs one advisory lock (an entry in PostgreSQL's lock table) per user in the batch, so
/// it is asked for only while batches meet busy accounts: batches over distinct users, the usual
/// load, never defer and never take one. Over hot accounts it keeps concurrent batches apart, so
/// a job is read and verified once instead of being deferred and read again (mix (c) of
/// deploy/bench/worker.sh with two processes: 5,400 of 20,000 jobs deferred without, none with).
/// The window bounds how often a sustained hot load meets busy accounts again: once per window.
package struct BusyAccountAvoidance: Sendable, Equatable {
    package let window: Duration
    package private(set) var lastDeferral: ContinuousClock.Instant?

    package init(window: Duration = .seconds(10)) {
        self.window = window
    }

    /// Until then skipping is not asked for, whatever batches meet (see `standDown`).
    package private(set) var stoodDownUntil: ContinuousClock.Instant?

    package mutating func record(deferred: Int, at now: ContinuousClock.Instant) {
        if deferred > 0 { lastDeferral = now }
    }

    /// After a batch failed for lack of shared memory (PostgreSQL's lock table full, which these
    /// locks may have filled): not asked for during the next `window`, so batches defer instead of
    /// failing. Returns whether it was asked for (the failure may be ours).
    package mutating func standDown(at now: ContinuousClock.Instant) -> Bool {
        let wasActive = isActive(at: now)
        stoodDownUntil = now + window
        return wasActive
    }

    package func isActive(at now: ContinuousClock.Instant) -> Bool {
        if let stoodDownUntil, now < stoodDownUntil { return false }
        guard let lastDeferral else { return false }
        return now - lastDeferral < window
    }
}
