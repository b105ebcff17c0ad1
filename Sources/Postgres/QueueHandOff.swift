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
///
/// The lock holds a count of hand-offs rather than nothing: a `Locked<Void>`'s empty value sits
/// at the start of the object, where TSan took our access to it for a write to the header that
/// the generic `withLock` reads before locking, and reported that instead.
struct QueueHandOff: Sendable {
    private let handedOver = Locked<UInt64>(0)

    /// On the queue: after the work, before resuming the continuation.
    func publish() { handedOver.withLock { $0 &+= 1 } }

    /// In the task: after the continuation returned or threw, before anything reads its value.
    func receive() { _ = handedOver.withLock { $0 } }
}
