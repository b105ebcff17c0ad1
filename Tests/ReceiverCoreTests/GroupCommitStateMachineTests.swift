import ReceiverCore
import Testing

/// The group commit's decisions, step by step, with time given rather than waited for (no
/// threads, no database): what `NotificationStore` does with each answer is its own business.
@Suite struct GroupCommitStateMachineTests {
    typealias Machine = GroupCommitStateMachine<Int>
    static let start = ContinuousClock.now

    static func machine(maxBatch: Int = 3, maxPending: Int = 5) -> Machine {
        var machine = Machine(options: .init(
            maxBatch: maxBatch, maxPending: maxPending, reconnectBackoff: .milliseconds(500), commitTimeout: .seconds(5)))
        machine.start()
        return machine
    }

    static func at(_ offset: Duration) -> ContinuousClock.Instant { start + offset }

    @Test func nothingIsQueuedBeforeStartOrAfterStop() {
        var machine = Machine(options: .init(maxBatch: 2, maxPending: 2, reconnectBackoff: .zero, commitTimeout: .seconds(5)))
        #expect(machine.submit(1, now: Self.start) == .shuttingDown)
        machine.start()
        #expect(machine.submit(1, now: Self.start) == nil)
        machine.stop()
        #expect(machine.submit(2, now: Self.start) == .shuttingDown)
        // What was queued before the stop is still drained, and then the committers are told to end.
        let (drained, running) = machine.takeBatch()
        #expect(drained.map(\.item) == [1] && !running)
    }

    @Test func whateverQueuedDuringACommitIsTheNextBatchUpToItsLimit() {
        var machine = Self.machine(maxBatch: 3, maxPending: 10)
        for item in 1...5 { #expect(machine.submit(item, now: Self.start) == nil) }
        let first = machine.takeBatch()
        #expect(first.batch.map(\.item) == [1, 2, 3] && first.running)
        #expect(machine.pendingCount == 2)
        #expect(machine.takeBatch().batch.map(\.item) == [4, 5])
        #expect(machine.takeBatch().batch.isEmpty, "nothing queued: an empty batch, never a wait")
    }

    @Test func aFullQueueRefusesWithOverloaded() {
        var machine = Self.machine(maxPending: 2)
        #expect(machine.submit(1, now: Self.start) == nil)
        #expect(machine.submit(2, now: Self.start) == nil)
        #expect(machine.submit(3, now: Self.start) == .overloaded)
        _ = machine.takeBatch()
        #expect(machine.submit(3, now: Self.start) == nil, "room again once a committer took the queue")
    }

    @Test func aFailedConnectRefusesForTheBackoffAndLogsTheOutageOnce() {
        var machine = Self.machine()
        #expect(machine.connected(.writable) == nil)
        #expect(machine.isReady)
        let first = machine.connectFailed(now: Self.at(.seconds(1)))
        #expect(first, "the first failure of an outage is logged")
        #expect(!machine.isReady)
        let second = machine.connectFailed(now: Self.at(.seconds(2)))
        #expect(!second, "later ones are not")
        #expect(machine.submit(1, now: Self.at(.milliseconds(2400))) == .databaseUnavailable)
        #expect(machine.submit(1, now: Self.at(.milliseconds(2500))) == nil, "the backoff is over")
        // Back: the outage's start comes out once, for the log line with its length.
        #expect(machine.connected(.writable) == Self.at(.seconds(1)))
        #expect(machine.isReady)
        let next = machine.connectFailed(now: Self.at(.seconds(9)))
        #expect(next, "a new outage is logged again")
    }

    @Test func aBrokenConnectionDuringACommitStartsTheBackoffAnOtherFailureDoesNot() {
        var machine = Self.machine()
        _ = machine.connected(.writable)
        machine.commitFailed(connectionBroken: false, schemaMissing: false, now: Self.start)
        #expect(!machine.isReady)
        #expect(machine.submit(1, now: Self.start) == nil, "a deadlock or a timeout: the next request is tried")
        machine.commitSucceeded()
        #expect(machine.isReady)
        machine.commitFailed(connectionBroken: true, schemaMissing: false, now: Self.start)
        #expect(machine.submit(2, now: Self.at(.milliseconds(100))) == .databaseUnavailable)
        #expect(machine.connected(.writable) == Self.start, "the commit's failure started the outage")
    }

    @Test func readinessNeedsTheSchemaAndAWritableDatabase() {
        var machine = Self.machine()
        #expect(!machine.isReady, "not before the first connect")
        _ = machine.connected(.unmigrated)
        #expect(!machine.isReady)
        _ = machine.connected(.refused)
        #expect(!machine.isReady, "a standby or a role without INSERT")
        _ = machine.connected(.writable)
        #expect(machine.isReady)
        machine.commitFailed(connectionBroken: false, schemaMissing: true, now: Self.start)
        machine.commitSucceeded()
        #expect(!machine.isReady, "a commit cannot bring a dropped table back; a check must")
        machine.probed(.writable, now: Self.start)
        #expect(machine.isReady)
    }

    @Test func theIdleProbeRestoresReadinessOnlyWhenNoCommitRanForFiveSeconds() {
        var machine = Self.machine()
        _ = machine.connected(.writable)
        _ = machine.submit(1, now: Self.start)
        let id = machine.commitStarted(machine.takeBatch().batch, now: Self.start)
        machine.commitFailed(connectionBroken: false, schemaMissing: false, now: Self.start)
        machine.answered(id)
        machine.probed(.writable, now: Self.at(.seconds(3)))
        #expect(!machine.isReady, "commits are running: their outcome decides")
        machine.probed(.writable, now: Self.at(.seconds(6)))
        #expect(machine.isReady, "traffic stopped because /readyz said 503: the probe must restore it")
        machine.probed(.refused, now: Self.at(.seconds(7)))
        #expect(!machine.isReady)
    }

    @Test func theWatchdogTakesQueuedRequestsInArrivalOrderOnceTheyWaitedTheTimeout() {
        var machine = Self.machine(maxPending: 10)
        _ = machine.submit(1, now: Self.at(.seconds(0)))
        _ = machine.submit(2, now: Self.at(.seconds(1)))
        _ = machine.submit(3, now: Self.at(.seconds(2)))
        #expect(machine.expire(now: Self.at(.milliseconds(4999))).expired.isEmpty)
        let tick = machine.expire(now: Self.at(.seconds(6)))
        #expect(tick.expired == [1, 2] && tick.stuckBatches == 0)
        #expect(machine.pendingCount == 1)
    }

    @Test func aCommitThatDoesNotComeBackIsGivenUpWholeAndMakesTheStoreUnready() {
        var machine = Self.machine()
        _ = machine.connected(.writable)
        _ = machine.submit(1, now: Self.at(.seconds(0)))
        _ = machine.submit(2, now: Self.at(.seconds(1)))
        _ = machine.commitStarted(machine.takeBatch().batch, now: Self.at(.seconds(1)))
        // The batch is as old as its oldest request, not as its commit.
        let tick = machine.expire(now: Self.at(.seconds(5)))
        #expect(tick.expired.sorted() == [1, 2] && tick.stuckBatches == 1)
        #expect(!machine.isReady)
        #expect(machine.expire(now: Self.at(.seconds(60))).expired.isEmpty, "each request is taken once")
    }

    @Test func theIdleProbeWaitsForACommitTheWatchdogGaveUpOnToComeBack() {
        var machine = Self.machine()
        _ = machine.connected(.writable)
        _ = machine.submit(1, now: Self.start)
        let id = machine.commitStarted(machine.takeBatch().batch, now: Self.start)
        #expect(machine.expire(now: Self.at(.seconds(5))).stuckBatches == 1)
        // Blocked on a lock another session holds: the database still looks writable.
        machine.probed(.writable, now: Self.at(.seconds(30)))
        #expect(!machine.isReady, "a commit is still blocked in the database")
        machine.answered(id)
        machine.probed(.writable, now: Self.at(.seconds(31)))
        #expect(machine.isReady)
    }

    @Test func anAnsweredBatchIsNoLongerTheWatchdogs() {
        var machine = Self.machine()
        _ = machine.submit(1, now: Self.start)
        let id = machine.commitStarted(machine.takeBatch().batch, now: Self.start)
        machine.commitSucceeded()
        machine.answered(id)
        #expect(machine.expire(now: Self.at(.seconds(60))).expired.isEmpty)
    }

    @Test func stopLeavesEveryUnansweredRequestToBeRefused() {
        var machine = Self.machine(maxBatch: 1)
        _ = machine.submit(1, now: Self.start)
        _ = machine.submit(2, now: Self.start)
        _ = machine.commitStarted(machine.takeBatch().batch, now: Self.start)
        machine.stop()
        #expect(machine.leftovers().sorted() == [1, 2], "one in flight, one queued")
        #expect(machine.leftovers().isEmpty)
        #expect(machine.pendingCount == 0)
    }
}
