import Testing
import Locking

/// The worker's wake-up signal (NOTIFY → claim, a finished job → claim more, shutdown). Each test
/// is bounded by its time limit, not by a clock it reads: a lost ring hangs for an hour and fails.
@Suite struct DoorbellTests {
    @Test(.timeLimit(.minutes(1))) func aRingBeforeTheWaitIsKept() async {
        let bell = Doorbell()
        bell.ring()
        await bell.wait(timeout: .seconds(3600))
    }

    @Test(.timeLimit(.minutes(1))) func ringAllAlsoWakesTheNextWait() async {
        let bell = Doorbell()
        bell.ringAll()
        await bell.wait(timeout: .seconds(3600))
    }

    @Test(.timeLimit(.minutes(1))) func aRingWakesAWaiter() async {
        let bell = Doorbell()
        async let woken: Void = bell.wait(timeout: .seconds(3600))
        // Whether the ring lands before or after the waiter registers, it is not lost.
        bell.ring()
        await woken
    }

    @Test(.timeLimit(.minutes(1))) func aWaitWithoutARingEndsAtItsTimeout() async {
        await Doorbell().wait(timeout: .milliseconds(1))
    }
}
