/// What the receiver's handler needs from storage: queue a verified notification and be told,
/// exactly once, whether it was committed; readiness and the backlog for `/readyz` and the
/// metrics; the rejection counters for `siwa status`. `NotificationStore` is the one that runs
/// (group commit over libpq); tests drive `ReceiverHandler` with one of their own.
package protocol NotificationStoring: Sendable {
    /// `respond` is called exactly once, from any thread.
    func submit(_ notification: VerifiedNotification, respond: @escaping @Sendable (NotificationStore.Outcome) -> Void)
    /// Counts a request refused as 400 or 401 (flushed to `siwa.rejections`).
    func countRejection(_ rejection: Rejection)
    /// The last commit or connect succeeded and the schema is migrated.
    var isReady: Bool { get }
    /// Verified notifications waiting for a commit.
    var pendingCount: Int { get }
}

extension NotificationStore: NotificationStoring {}
