import Testing
import WorkerCore

@Suite("Notification batch limit")
struct NotificationBatchLimitTests {
    @Test func startsLargestAndHalvesOnDeferralDownToASixteenth() {
        var limit = NotificationBatchLimit(largest: 256)
        #expect(limit.value == 256)
        limit.record(taken: 200, deferred: 56)
        #expect(limit.value == 128)
        for _ in 0..<10 { limit.record(taken: 1, deferred: 1) }
        #expect(limit.value == 16)
    }

    /// Grown back by a sixteenth per full batch, not doubled: a doubled limit overshot the size at
    /// which concurrent batches over hot accounts stop deferring each other's jobs.
    @Test func aFullBatchGrowsItBackBySteps() {
        var limit = NotificationBatchLimit(largest: 256)
        for _ in 0..<4 { limit.record(taken: 0, deferred: 1) }
        #expect(limit.value == 16)
        limit.record(taken: 16, deferred: 0)
        #expect(limit.value == 32)
        limit.record(taken: 32, deferred: 0)
        #expect(limit.value == 48)
        limit.record(taken: 20, deferred: 0)  // not full: the backlog ran out, nothing learned
        #expect(limit.value == 48)
        for _ in 0..<40 { limit.record(taken: limit.value, deferred: 0) }
        #expect(limit.value == 256)
    }

    @Test func aBatchOfOneStaysPossible() {
        var limit = NotificationBatchLimit(largest: 1)
        limit.record(taken: 0, deferred: 1)
        #expect(limit.value == 1)
        limit.record(taken: 1, deferred: 0)
        #expect(limit.value == 1)
    }
}

@Suite("Retry after a deferral")
struct DeferredRetryTests {
    @Test func withoutADeferralTheLoopWaitsForThePoll() {
        var retry = DeferredRetry(pollInterval: .seconds(1))
        #expect(retry.wait(after: .milliseconds(20)) == .seconds(1))
        retry.record(deferred: 0)
        #expect(retry.wait(after: .milliseconds(20)) == .seconds(1))
    }

    @Test func afterADeferralAboutAsLongAsTheBatchDoublingWhileItLastsNeverPastThePoll() {
        var retry = DeferredRetry(pollInterval: .seconds(1))
        retry.record(deferred: 3)
        #expect(retry.wait(after: .milliseconds(20)) == .milliseconds(20))
        retry.record(deferred: 1)
        #expect(retry.wait(after: .milliseconds(20)) == .milliseconds(40))
        for _ in 0..<30 { retry.record(deferred: 1) }
        #expect(retry.wait(after: .milliseconds(20)) == .seconds(1))
        #expect(retry.wait(after: .zero) == .seconds(1))
        retry.record(deferred: 0)
        #expect(retry.wait(after: .milliseconds(20)) == .seconds(1))
        retry.record(deferred: 1)
        #expect(retry.wait(after: .zero) == .milliseconds(1))
        // A long poll interval does not let a held account's job wait longer than 2 s.
        var patient = DeferredRetry(pollInterval: .seconds(3600))
        for _ in 0..<30 { patient.record(deferred: 1) }
        #expect(patient.wait(after: .milliseconds(20)) == .seconds(2))
    }

    /// Asked for from a batch that deferred jobs until a window passes without another; a process
    /// whose batches never meet busy accounts never asks (it would only fill the lock table).
    @Test func busyUsersAreSkippedOnlyWhileBatchesMeetThem() {
        let start = ContinuousClock.now
        var avoidance = BusyAccountAvoidance(window: .seconds(10))
        avoidance.record(deferred: 0, at: start)
        #expect(!avoidance.isActive(at: start))
        avoidance.record(deferred: 3, at: start + .seconds(1))
        #expect(avoidance.isActive(at: start + .seconds(1)))
        avoidance.record(deferred: 0, at: start + .seconds(6))  // a batch that did not defer changes nothing
        #expect(avoidance.isActive(at: start + .milliseconds(10_999)))
        #expect(!avoidance.isActive(at: start + .seconds(11)))
        avoidance.record(deferred: 1, at: start + .seconds(20))
        #expect(avoidance.isActive(at: start + .seconds(29)))
    }

    /// A batch that failed for lack of shared memory while skipping (the lock table full) stops
    /// the skipping for a window, deferrals or not; one that failed without skipping reports no cause.
    @Test func aFullLockTableStandsSkippingDown() {
        let start = ContinuousClock.now
        var avoidance = BusyAccountAvoidance(window: .seconds(10))
        let idle = avoidance.standDown(at: start)
        #expect(!idle)
        avoidance.record(deferred: 2, at: start + .seconds(20))
        #expect(avoidance.isActive(at: start + .seconds(21)))
        let skipping = avoidance.standDown(at: start + .seconds(21))
        #expect(skipping)
        avoidance.record(deferred: 5, at: start + .seconds(25))
        #expect(!avoidance.isActive(at: start + .seconds(30)))
        #expect(avoidance.isActive(at: start + .seconds(31)))  // the deferral at 25 s still counts
        #expect(!avoidance.isActive(at: start + .seconds(36)))
    }
}
