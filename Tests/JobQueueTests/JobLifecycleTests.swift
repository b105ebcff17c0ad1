import Foundation
import JobQueue
import Testing

@Suite struct JobLifecycleTests {
    let policy = RetryPolicy(base: .seconds(1), cap: .seconds(600))

    func job(kind: JobKind = .revoke, attempt: Int = 1, maxAttempts: Int = 3, errors: Int = 0) -> Job {
        Job(
            id: 7, kind: kind, clientID: "com.example", sub: "s", notificationJTI: nil, argumentsJSON: "{}",
            attempt: attempt, maxAttempts: maxAttempts, errorCount: errors, createdAt: Date())
    }

    @Test func completedCompletes() {
        #expect(JobLifecycle.decide(.completed(outcome: "revoked"), job: job(), policy: policy) == .complete(outcome: "revoked"))
        #expect(JobLifecycle.decide(.completedByHandler, job: job(), policy: policy) == .nothing)
    }

    @Test func failureRetriesWithBackoffUntilMaxAttempts() {
        let first = JobLifecycle.decide(.failed(error: "503"), job: job(errors: 0), policy: policy, unit: 0.5)
        #expect(first == .retry(error: "503", after: .milliseconds(500)))
        let second = JobLifecycle.decide(.failed(error: "503"), job: job(errors: 1), policy: policy, unit: 0.5)
        #expect(second == .retry(error: "503", after: .seconds(1)))
        // The third failure of a job allowed three attempts keeps it as discarded.
        #expect(JobLifecycle.decide(.failed(error: "503"), job: job(errors: 2), policy: policy) == .discard(error: "503"))
    }

    @Test func discardCountsErrorsNotAttempts() {
        // Snoozes and lost leases grew `attempt` far past max_attempts: still a retry.
        let action = JobLifecycle.decide(.failed(error: "x"), job: job(attempt: 50, errors: 0), policy: policy, unit: 0)
        #expect(action == .retry(error: "x", after: .zero))
    }

    @Test func revokeIsNeverDiscarded() {
        let revoke = job(kind: .revoke, attempt: 10_000, maxAttempts: Int(Int32.max), errors: 9_999)
        guard case .retry(_, let delay) = JobLifecycle.decide(.failed(error: "invalid_client"), job: revoke, policy: policy)
        else {
            Issue.record("a revoke must retry")
            return
        }
        #expect(delay <= .seconds(600))
    }

    @Test func retryAfterIsAFloor() {
        let action = JobLifecycle.decide(
            .failed(error: "429", retryAfter: .seconds(30)), job: job(), policy: policy, unit: 0.1)
        #expect(action == .retry(error: "429", after: .seconds(30)))
    }

    @Test func snoozeAndDiscard() {
        #expect(JobLifecycle.decide(.snoozed(reason: "paused", for: .seconds(5)), job: job(), policy: policy)
            == .snooze(reason: "paused", for: .seconds(5)))
        #expect(JobLifecycle.decide(.discarded(error: "bad args"), job: job(), policy: policy) == .discard(error: "bad args"))
        #expect(JobLifecycle.unhandled(job(kind: .exchange)) == .snooze(
            reason: "no handler registered for kind exchange", for: .seconds(60)))
    }

    @Test func longErrorsAreTruncated() {
        let action = JobLifecycle.decide(.discarded(error: String(repeating: "e", count: 5000)), job: job(), policy: policy)
        guard case .discard(let error) = action else {
            Issue.record("expected discard")
            return
        }
        #expect(error.count == JobLifecycle.maxErrorLength + 1)
    }

    @Test func metricNames() {
        #expect(JobAction.retry(error: "", after: .zero).metric == .retried)
        #expect(JobAction.nothing.metric == .completed)
        #expect(JobAction.discard(error: "").metric == .discarded)
    }
}
