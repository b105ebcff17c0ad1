import Locking

/// The order between a connection's queue and the task awaiting its work, spelled out for
/// ThreadSanitizer.
///
/// The queue builds a value (a `PostgresResult`, an error) and resumes a continuation; the task
/// reads it after its `await`. The continuation already orders the two, but TSan sees that order
/// only when the task had suspended before the resume: the runtime then enqueues the task, which it
/// annotates. When the queue resumes first (the awaiting thread was descheduled between `queue.async`
/// and the `await`, routine on a loaded machine), `swift_continuation_await` finds the continuation
/// resumed and carries on without telling TSan, and libdispatch is no help on Linux
/// (swift-corelibs-libdispatch#655). Every field the queue wrote was then reported as a race with
/// the task's read (`Rows.endIndex`, `Row.columnIndex`, `Row.decode`).
///
/// A pthread mutex is something TSan sees: the queue passes through it after the work and before
/// resuming (`publish`), the task after its `await` (`receive`). The task's lock cannot be taken
/// before the queue's unlock, since the resume comes after that unlock, so the edge TSan records is
/// one the program really has. The lock is the connection's own, so this costs two uncontended
/// lock/unlock pairs a call and no allocation.
struct QueueHandOff: Sendable {
    private let lock = Locked(())

    /// On the queue: after the work, before resuming the continuation.
    func publish() { lock.withLock { _ in } }

    /// In the task: after the continuation returned or threw, before anything reads its value.
    func receive() { lock.withLock { _ in } }
}
