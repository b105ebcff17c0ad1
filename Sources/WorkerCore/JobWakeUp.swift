package import Postgres

/// What a burst of `NOTIFY siwa_jobs` announces, so each of the worker's loops is woken only for
/// work of its own (`siwa.wake_workers`): a payload is the number of new notification jobs, then
/// `calls` when Apple-calling jobs were queued and `webhooks` when deliveries were (`12`,
/// `0 webhooks`, `3 calls webhooks`). A payload this worker cannot read wakes every loop.
package struct JobWakeUp: Sendable, Equatable {
    package var notificationJobs = 0
    package var calls = false
    package var webhooks = false

    package init(notificationJobs: Int = 0, calls: Bool = false, webhooks: Bool = false) {
        self.notificationJobs = notificationJobs
        self.calls = calls
        self.webhooks = webhooks
    }

    package init(_ notifications: [PostgresNotification]) {
        for notification in notifications { add(payload: notification.payload) }
    }

    private mutating func add(payload: String) {
        let words = payload.split(separator: " ")
        guard let first = words.first, let count = Int(first), count >= 0,
            words.dropFirst().allSatisfy({ $0 == "calls" || $0 == "webhooks" })
        else {
            notificationJobs += 1
            calls = true
            webhooks = true
            return
        }
        notificationJobs += count
        calls = calls || words.contains("calls")
        webhooks = webhooks || words.contains("webhooks")
    }
}
