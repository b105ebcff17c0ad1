package import Foundation

/// The kinds of work in `siwa.jobs` (its `kind` CHECK constraint).
package enum JobKind: String, Sendable, CaseIterable {
    /// Apply a stored notification's effect (WorkerCore, in SQL: `siwa.apply_notification`).
    case notification
    /// Exchange a fresh authorization code at `{base}/auth/token` (queued by `siwa.link_account`).
    case exchange
    /// Revoke the refresh token at `{base}/auth/revoke` (queued by `siwa.request_deletion`).
    case revoke
    /// Check a linked account's refresh token with Apple (opt-in reconciliation).
    case reconcile
    /// Deliver an account change to the app's webhook (queued by a trigger on `siwa.account_changes`
    /// while an endpoint is registered; claimed only by WorkerCore's webhook dispatcher, in order per
    /// account).
    case webhook
}

/// A claimed job. `attempt` is the lease's fencing token: it grows on every claim, so a worker
/// whose lease expired and whose job was claimed again can no longer complete it.
package struct Job: Sendable, Equatable {
    package var id: Int64
    package var kind: JobKind
    package var clientID: String
    package var sub: String
    package var notificationJTI: String?
    /// `args` jsonb as text. For `exchange` it holds the authorization code: never log it.
    package var argumentsJSON: String
    package var attempt: Int
    package var maxAttempts: Int
    /// Failures recorded so far (length of `errors`).
    package var errorCount: Int
    package var createdAt: Date

    package init(
        id: Int64, kind: JobKind, clientID: String, sub: String, notificationJTI: String?, argumentsJSON: String,
        attempt: Int, maxAttempts: Int, errorCount: Int, createdAt: Date
    ) {
        self.id = id
        self.kind = kind
        self.clientID = clientID
        self.sub = sub
        self.notificationJTI = notificationJTI
        self.argumentsJSON = argumentsJSON
        self.attempt = attempt
        self.maxAttempts = maxAttempts
        self.errorCount = errorCount
        self.createdAt = createdAt
    }
}

/// What a handler decided. The executor turns it into the row's next state; handlers that must
/// complete a job in the same transaction as their effect do so themselves (`JobQueue.complete`
/// with the fencing check) and return `.completedByHandler`.
package enum JobResult: Sendable, Equatable {
    /// Done; the executor marks it completed with this outcome.
    case completed(outcome: String)
    /// The handler already completed the job inside its own transaction (or found its lease lost).
    case completedByHandler
    /// Failed; retry with the policy's backoff (or after `retryAfter`, e.g. Apple's Retry-After).
    /// Counted against `maxAttempts`; at the limit the job is kept as `discarded`.
    case failed(error: String, retryAfter: Duration? = nil)
    /// Not a failure of this job (e.g. its client ID is paused): run again later, attempt not counted.
    case snoozed(reason: String, for: Duration)
    /// Cannot succeed by retrying (bad input): keep it as `discarded` with this error.
    case discarded(error: String)
}
