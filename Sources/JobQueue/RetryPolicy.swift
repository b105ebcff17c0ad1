/// Exponential backoff with full jitter (AWS architecture blog, "Exponential Backoff And Jitter"):
/// the delay after the n-th failure is uniform in `[0, min(cap, base * 2^(n-1))]`. A queued job's
/// retry is not drawn here: its base and cap go to `siwa.fail_jobs` (a webhook delivery's to
/// `siwa.finish_webhook_deliveries`), and `siwa.job_retry` (`siwa.webhook_retry` for deliveries,
/// sql/functions/queue.sql) decides (retry or discard, when). The delays drawn here are for waits
/// inside a process (reconnecting to the database, team transfer's calls). Pure: the random source
/// is a parameter.
package struct RetryPolicy: Sendable, Equatable {
    package var base: Duration
    package var cap: Duration

    package init(base: Duration = .seconds(1), cap: Duration = .seconds(3600)) {
        precondition(base > .zero && cap >= base, "backoff needs 0 < base <= cap")
        self.base = base
        self.cap = cap
    }

    /// The upper bound of the delay after `failures` failures (1 = the first failure).
    package func ceiling(afterFailures failures: Int) -> Duration {
        let exponent = min(max(failures, 1) - 1, 60)
        let seconds = min(cap.seconds, base.seconds * Double(sign: .plus, exponent: exponent, significand: 1))
        return .milliseconds(Int64((seconds * 1000).rounded()))
    }

    /// A delay for the retry after `failures` failures, `unit` in [0, 1) from the caller's random source.
    package func delay(afterFailures failures: Int, unit: Double) -> Duration {
        let clamped = min(max(unit, 0), 1)
        let ceiling = ceiling(afterFailures: failures)
        return .milliseconds(Int64((ceiling.seconds * clamped * 1000).rounded(.down)))
    }

    package func delay<G: RandomNumberGenerator>(afterFailures failures: Int, using generator: inout G) -> Duration {
        delay(afterFailures: failures, unit: Double.random(in: 0..<1, using: &generator))
    }

    package func delay(afterFailures failures: Int) -> Duration {
        // Not through `using:` with a local SystemRandomNumberGenerator: that generator has no
        // storage, and ThreadSanitizer took every thread's access to it for the same variable
        // (a race reported in siwa-worker's notification loop).
        delay(afterFailures: failures, unit: Double.random(in: 0..<1))
    }
}

extension Duration {
    /// Fractional seconds (JobQueue does not depend on SiwaCore's helper to stay unit-testable alone).
    var seconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
}
