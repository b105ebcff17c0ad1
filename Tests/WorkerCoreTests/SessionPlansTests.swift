import Testing
import WorkerCore

/// When a notification session's kept plans are made again (`SessionPlans`), as sentences.
@Suite("Session plans")
struct SessionPlansTests {
    let one = SessionPlans.Session(server: "127.0.0.1:5432", backendPID: 101)
    let other = SessionPlans.Session(server: "127.0.0.1:5432", backendPID: 102)
    let start = ContinuousClock.now

    func refresh(_ plans: inout SessionPlans, _ session: SessionPlans.Session, before batch: Int, at now: ContinuousClock.Instant) -> Bool {
        plans.shouldRefresh(session, before: batch, at: now)
    }

    @Test func aSessionNeverRefreshedRefreshesBeforeItsFirstLargeBatchOnly() {
        var plans = SessionPlans()
        #expect(!refresh(&plans, one, before: SessionPlans.smallest - 1, at: start), "a small batch: the plan's shape does not matter")
        plans.record(one, taken: 5)
        #expect(refresh(&plans, one, before: 250, at: start), "its plans were made on whatever the tables held")
        plans.record(one, taken: 250)
        #expect(!refresh(&plans, one, before: 250, at: start + .seconds(60)), "made again for 250: nothing grew since")
    }

    @Test func aLargeBatchAfterASmallOneRefreshesOncePerInterval() {
        var plans = SessionPlans()
        #expect(refresh(&plans, one, before: 250, at: start))
        plans.record(one, taken: 250)
        plans.record(one, taken: 3)  // a quiet spell: its plans may be made again on a near-empty table
        #expect(!refresh(&plans, one, before: 250, at: start + SessionPlans.interval - .milliseconds(1)), "within the interval")
        #expect(refresh(&plans, one, before: 250, at: start + SessionPlans.interval), "the interval has passed")
    }

    @Test func growthBelowTheFactorDoesNotRefresh() {
        var plans = SessionPlans()
        #expect(refresh(&plans, one, before: 40, at: start))
        plans.record(one, taken: 40)
        let later = start + .seconds(30)
        #expect(!refresh(&plans, one, before: SessionPlans.growth * 40 - 1, at: later))
        #expect(refresh(&plans, one, before: SessionPlans.growth * 40, at: later))
    }

    @Test func sessionsAreCountedApart() {
        var plans = SessionPlans()
        #expect(refresh(&plans, one, before: 250, at: start))
        plans.record(one, taken: 250)
        #expect(refresh(&plans, other, before: 250, at: start), "another session has plans of its own")
        #expect(!refresh(&plans, one, before: 250, at: start + .seconds(1)))
    }
}
