/// What to do with a claimed job once its handler returned: the pure half of the executor
/// (STYLE §5: state machine returns actions, I/O happens outside). Unit-tested without a database.
/// Whether a failure is retried or discarded, and when the retry runs, is not decided here: one SQL
/// function says it for every job (`siwa.job_retry`, sql/functions/queue.sql), and the worker counts
/// what the write reports (`JobWritten`).
package enum JobAction: Sendable, Equatable {
    /// Mark completed (fenced) with this outcome.
    case complete(outcome: String)
    /// The handler completed it in its own transaction; nothing to write.
    case nothing
    /// A failure, `error` appended to `errors` (`siwa.fail_jobs`): tried again after the backoff, never
    /// sooner than `retryAfter` (Apple's Retry-After), or discarded once its failures reach max_attempts.
    case fail(error: String, retryAfter: Duration?)
    /// Cannot succeed by retrying: `discarded` at once, `error` appended (kept for `siwa jobs retry`).
    case discard(error: String)
    /// Back to `available` at now + `for`, no error recorded (the attempt still grows: it is the fence).
    case snooze(reason: String, for: Duration)
}

/// What writing a `JobAction` left the job in, as the database reports it: the metric counts this.
package enum JobWritten: Sendable, Equatable {
    case completed
    /// Back to `available`, due in `after`.
    case retried(after: Duration)
    case discarded
    case snoozed

    /// The metric this counts under.
    package var metric: JobMetric {
        switch self {
        case .completed: .completed
        case .retried: .retried
        case .discarded: .discarded
        case .snoozed: .snoozed
        }
    }
}

package enum JobMetric: String, Sendable {
    case completed, retried, discarded, snoozed
}

package enum JobLifecycle {
    /// How long an unregistered kind waits before it is tried again (never dropped).
    package static let unhandledKindSnooze: Duration = .seconds(60)
    /// Errors are stored on the row; keep them bounded.
    package static let maxErrorLength = 2000

    /// The write a handler's result asks for.
    package static func decide(_ result: JobResult) -> JobAction {
        switch result {
        case .completed(let outcome): .complete(outcome: outcome)
        case .completedByHandler: .nothing
        case .snoozed(let reason, let duration): .snooze(reason: reason, for: max(duration, .zero))
        case .discarded(let error): .discard(error: truncate(error))
        case .failed(let error, let retryAfter): .fail(error: truncate(error), retryAfter: retryAfter)
        }
    }

    /// What an unregistered kind gets: a loud snooze, never a drop.
    package static func unhandled(_ job: Job) -> JobAction {
        .snooze(reason: "no handler registered for kind \(job.kind.rawValue)", for: unhandledKindSnooze)
    }

    static func truncate(_ error: String) -> String {
        error.count <= maxErrorLength ? error : String(error.prefix(maxErrorLength)) + "…"
    }
}
