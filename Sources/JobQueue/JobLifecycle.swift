/// What to do with a claimed job once its handler returned: the pure half of the executor
/// (STYLE §5: state machine returns actions, I/O happens outside). Unit-tested without a database.
package enum JobAction: Sendable, Equatable {
    /// Mark completed (fenced) with this outcome.
    case complete(outcome: String)
    /// The handler completed it in its own transaction; nothing to write.
    case nothing
    /// Back to `available` at now + `after`, appending `error` to `errors`.
    case retry(error: String, after: Duration)
    /// Final `discarded`, appending `error` (kept for an operator's `siwa jobs retry`).
    case discard(error: String)
    /// Back to `available` at now + `for`, no error recorded (the attempt still grows: it is the fence).
    case snooze(reason: String, for: Duration)

    /// The metric this action counts under.
    package var metric: JobMetric {
        switch self {
        case .complete, .nothing: .completed
        case .retry: .retried
        case .discard: .discarded
        case .snooze: .snoozed
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

    /// Decides the next state. `failures` counts `errors` entries (not `attempt`, which snoozes and
    /// lease losses also grow); a failure that makes it reach `maxAttempts` discards the job.
    package static func decide(
        _ result: JobResult, job: Job, policy: RetryPolicy, unit: Double = Double.random(in: 0..<1)
    ) -> JobAction {
        switch result {
        case .completed(let outcome):
            return .complete(outcome: outcome)
        case .completedByHandler:
            return .nothing
        case .snoozed(let reason, let duration):
            return .snooze(reason: reason, for: max(duration, .zero))
        case .discarded(let error):
            return .discard(error: truncate(error))
        case .failed(let error, let retryAfter):
            let failures = job.errorCount + 1
            if failures >= job.maxAttempts { return .discard(error: truncate(error)) }
            let backoff = policy.delay(afterFailures: failures, unit: unit)
            // Apple's Retry-After is a floor, never a reason to retry sooner than the backoff.
            let delay = retryAfter.map { max($0, backoff) } ?? backoff
            return .retry(error: truncate(error), after: delay)
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
