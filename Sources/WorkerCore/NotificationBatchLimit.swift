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
