import Locking
import TestTiming
import Testing

/// The worker's wake-up signal (NOTIFY → claim, a finished job → claim more, shutdown). A wait says
/// whether it was rung or timed out; a ring lost would show as `.timedOut` after the bound (a bound
/// for a hang, not a speed requirement: a kept ring returns at once).
@Suite struct DoorbellTests {
    static let bound = TestTimeScale.scaled(.seconds(10))

    @Test func aRingBeforeTheWaitIsKept() async {
        let bell = Doorbell()
        bell.ring()
        #expect(await bell.wait(timeout: Self.bound) == .rung)
    }

    @Test func aKeptRingWakesOneWaitOnly() async {
        let bell = Doorbell()
        bell.ring()
        bell.ring()  // rings do not add up: one pending ring at most
        #expect(await bell.wait(timeout: Self.bound) == .rung)
        #expect(await bell.wait(timeout: .milliseconds(1)) == .timedOut)
    }

    @Test func ringAllAlsoWakesTheNextWait() async {
        let bell = Doorbell()
        bell.ringAll()
        #expect(await bell.wait(timeout: Self.bound) == .rung)
    }

    @Test func aRingWakesAWaiter() async {
        let bell = Doorbell()
        async let woken = bell.wait(timeout: Self.bound)
        // Whether the ring lands before or after the waiter registers, it is not lost.
        bell.ring()
        #expect(await woken == .rung)
    }

    @Test func aWaitWithoutARingEndsAtItsTimeoutAndLeavesNoRing() async {
        let bell = Doorbell()
        #expect(await bell.wait(timeout: .milliseconds(1)) == .timedOut)
        // The expired waiter is gone: the next ring is kept for the next wait, not given to it.
        bell.ring()
        #expect(await bell.wait(timeout: Self.bound) == .rung)
    }
}
