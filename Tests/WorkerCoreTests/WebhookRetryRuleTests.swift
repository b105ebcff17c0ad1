import JobQueue
import Testing
import Webhooks

@Suite("Webhook retry rule")
struct WebhookRetryRuleTests {
    let rule = WebhookRetryRule(policy: RetryPolicy(base: .seconds(1), cap: .seconds(3600)), window: .seconds(86_400))

    @Test func only2xxIsDelivered() {
        #expect(rule.decide(.answered(status: 204, bodyPrefix: ""), failures: 3, sinceFirstFailure: .seconds(90_000))
            == .completed(outcome: "delivered 204"))
        for status in [100, 301, 302, 304, 307, 400, 404, 410, 429, 500, 503] {
            guard case .retry = rule.decide(.answered(status: status, bodyPrefix: ""), failures: 0, sinceFirstFailure: nil, unit: 0.5)
            else {
                Issue.record("status \(status) was not retried")
                continue
            }
        }
        #expect(WebhookAttemptResult.answered(status: 302, bodyPrefix: "").failureReason == "redirect")
        #expect(WebhookAttemptResult.answered(status: 302, bodyPrefix: "").errorText.contains("not followed"))
        #expect(WebhookAttemptResult.answered(status: 500, bodyPrefix: "secret-ish body").errorText == "answered 500")
        #expect(WebhookAttemptResult.timedOut.failureReason == "timeout")
        #expect(WebhookAttemptResult.connectionFailed(detail: "URLError -1004").failureReason == "connection")
    }

    @Test func backoffGrowsWithJitter() {
        // Full jitter: the delay is the draw times the ceiling, which doubles per failure up to the cap.
        #expect(rule.decide(.timedOut, failures: 0, sinceFirstFailure: nil, unit: 0.5) == .retry(
            error: "no answer within the timeout", after: .milliseconds(500)))
        #expect(rule.decide(.timedOut, failures: 4, sinceFirstFailure: .seconds(10), unit: 0.5) == .retry(
            error: "no answer within the timeout", after: .seconds(8)))
        #expect(rule.decide(.timedOut, failures: 40, sinceFirstFailure: .seconds(10), unit: 0.999) == .retry(
            error: "no answer within the timeout", after: .milliseconds(3_596_400)))
    }

    @Test func retriedForTheWholeWindowThenDiscarded() {
        // The first failure never discards, however long the change waited behind others.
        guard case .retry = rule.decide(.timedOut, failures: 0, sinceFirstFailure: nil, unit: 0.9) else {
            Issue.record("first failure not retried")
            return
        }
        // Near the end, the retry lands at the window's end, not past it...
        #expect(rule.decide(.timedOut, failures: 30, sinceFirstFailure: .seconds(86_000), unit: 0.99)
            == .retry(error: "no answer within the timeout", after: .seconds(400)))
        // ...and a failure at or after the end discards.
        #expect(rule.decide(.timedOut, failures: 31, sinceFirstFailure: .seconds(86_400)) == .discard(
            error: "no answer within the timeout"))
    }

    /// Simulates a receiver that never answers: the delivery is retried for at least 24 h, whatever
    /// the draws, and then discarded.
    @Test func neverDiscardedBefore24Hours() {
        var generator = SplitMix(seed: 42)
        for _ in 0..<200 {
            var elapsed: Duration = .zero
            var failures = 0
            var first = true
            while true {
                let unit = Double(generator.next() % 1_000_000) / 1_000_000
                let finish = rule.decide(.timedOut, failures: failures, sinceFirstFailure: first ? nil : elapsed, unit: unit)
                first = false
                failures += 1
                if case .retry(_, let delay) = finish {
                    elapsed += delay
                    continue
                }
                #expect(elapsed >= .seconds(86_400))
                break
            }
        }
    }
}

struct SplitMix: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
