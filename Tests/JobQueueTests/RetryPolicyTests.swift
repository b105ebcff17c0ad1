import Foundation
import JobQueue
import Testing

@Suite struct RetryPolicyTests {
    let policy = RetryPolicy(base: .seconds(1), cap: .seconds(60))

    @Test func ceilingDoublesUpToTheCap() {
        #expect(policy.ceiling(afterFailures: 1) == .seconds(1))
        #expect(policy.ceiling(afterFailures: 2) == .seconds(2))
        #expect(policy.ceiling(afterFailures: 6) == .seconds(32))
        #expect(policy.ceiling(afterFailures: 7) == .seconds(60))
        #expect(policy.ceiling(afterFailures: 10_000) == .seconds(60))
        #expect(policy.ceiling(afterFailures: 0) == .seconds(1))
    }

    @Test func fullJitterSpansZeroToCeiling() {
        #expect(policy.delay(afterFailures: 3, unit: 0) == .zero)
        #expect(policy.delay(afterFailures: 3, unit: 0.5) == .seconds(2))
        #expect(policy.delay(afterFailures: 3, unit: 0.999_999) < .seconds(4))
        #expect(policy.delay(afterFailures: 3, unit: 7) == .seconds(4))  // clamped
    }

    @Test func randomDelaysStayInRangeAndSpread() {
        var seen = Set<Int64>()
        for failures in 1...40 {
            for _ in 0..<50 {
                let delay = policy.delay(afterFailures: failures)
                #expect(delay >= .zero)
                #expect(delay <= policy.ceiling(afterFailures: failures))
                seen.insert(delay.components.seconds)
            }
        }
        #expect(seen.count > 20, "full jitter should spread delays across the range")
    }
}
