import Foundation
import JobQueue
import Testing

/// What a handler's result asks the queue to write. Whether a failure is retried or discarded, and
/// when, is `siwa.job_retry`'s (Tests/IntegrationTests/JobRetryTableTests.swift).
@Suite struct JobLifecycleTests {
    func job(kind: JobKind = .revoke) -> Job {
        Job(
            id: 7, kind: kind, clientID: "com.example", sub: "s", notificationJTI: nil, argumentsJSON: "{}",
            attempt: 1, maxAttempts: 3, errorCount: 0, createdAt: Date())
    }

    @Test func completedCompletes() {
        #expect(JobLifecycle.decide(.completed(outcome: "revoked")) == .complete(outcome: "revoked"))
        #expect(JobLifecycle.decide(.completedByHandler) == .nothing)
    }

    @Test func aFailureIsRecordedWithItsRetryAfter() {
        #expect(JobLifecycle.decide(.failed(error: "503")) == .fail(error: "503", retryAfter: nil))
        #expect(JobLifecycle.decide(.failed(error: "429", retryAfter: .seconds(30))) == .fail(error: "429", retryAfter: .seconds(30)))
    }

    @Test func snoozeAndDiscard() {
        #expect(JobLifecycle.decide(.snoozed(reason: "paused", for: .seconds(5))) == .snooze(reason: "paused", for: .seconds(5)))
        #expect(JobLifecycle.decide(.snoozed(reason: "paused", for: .seconds(-5))) == .snooze(reason: "paused", for: .zero))
        #expect(JobLifecycle.decide(.discarded(error: "bad args")) == .discard(error: "bad args"))
        #expect(JobLifecycle.unhandled(job(kind: .exchange)) == .snooze(
            reason: "no handler registered for kind exchange", for: .seconds(60)))
    }

    @Test func longErrorsAreTruncated() {
        for result in [JobResult.discarded(error: String(repeating: "e", count: 5000)), .failed(error: String(repeating: "e", count: 5000))] {
            switch JobLifecycle.decide(result) {
            case .discard(let error), .fail(let error, _): #expect(error.count == JobLifecycle.maxErrorLength + 1)
            default: Issue.record("expected a failure")
            }
        }
    }

    @Test func metricNames() {
        #expect(JobWritten.retried(after: .zero).metric == .retried)
        #expect(JobWritten.completed.metric == .completed)
        #expect(JobWritten.discarded.metric == .discarded)
        #expect(JobWritten.snoozed.metric == .snoozed)
    }
}
