internal import Foundation
package import JobQueue

/// What happens to a delivery after an attempt: the pure half of the dispatcher, tested without a
/// database or a network. Deliveries end by time, not by count: a failed one is retried with
/// exponential backoff and full jitter until `window` has passed since its first failure, then
/// discarded (kept for `siwa jobs retry`).
package struct WebhookRetryRule: Sendable {
    package var policy: RetryPolicy
    package var window: Duration

    package init(policy: RetryPolicy, window: Duration) {
        self.policy = policy
        self.window = window
    }

    /// - Parameters:
    ///   - failures: failures recorded before this attempt.
    ///   - sinceFirstFailure: time from the first recorded failure to now (nil: this is the first).
    ///   - unit: the jitter's random draw in [0, 1).
    package func decide(
        _ result: WebhookAttemptResult, failures: Int, sinceFirstFailure: Duration?,
        unit: Double = Double.random(in: 0..<1)
    ) -> WebhookQueue.Finish {
        if case .answered(let status, _) = result, (200...299).contains(status) {
            return .completed(outcome: "delivered \(status)")
        }
        let error = result.errorText
        if let elapsed = sinceFirstFailure, elapsed >= window { return .discard(error: error) }
        var delay = policy.delay(afterFailures: failures + 1, unit: unit)
        // Never scheduled past the window's end by much: the last retry lands at its end, and the
        // failure there discards.
        if let elapsed = sinceFirstFailure { delay = min(delay, max(window - elapsed, .zero)) }
        return .retry(error: error, after: delay)
    }
}
