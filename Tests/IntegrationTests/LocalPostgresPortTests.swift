import LocalPostgres
import Synchronization
import Testing

/// PostgreSQL cannot listen on port 0, so its port is chosen before the server binds it; a server
/// that finds it taken costs a fresh attempt on a fresh port (`start`, `startStandby`), a bounded
/// number of times.
@Suite struct LocalPostgresPortTests {
    struct Refused: Error, Equatable { var attempt: Int }

    @Test func aTakenPortIsTriedAgainThenGivenUp() async throws {
        let attempts = Mutex(0)
        let started = try await LocalPostgresCluster.onFreshPorts(logger: TestDatabase.logger) { () async throws -> Int in
            let attempt = attempts.withLock { $0 += 1; return $0 }
            if attempt < 3 { throw LocalPostgresCluster.PortTaken(port: 5000 + attempt, underlying: Refused(attempt: attempt)) }
            return attempt
        }
        #expect(started == 3)

        attempts.withLock { $0 = 0 }
        await #expect(throws: Refused(attempt: 3)) {
            try await LocalPostgresCluster.onFreshPorts(logger: TestDatabase.logger) { () async throws -> Int in
                let attempt = attempts.withLock { $0 += 1; return $0 }
                throw LocalPostgresCluster.PortTaken(port: 5000 + attempt, underlying: Refused(attempt: attempt))
            }
        }
        #expect(attempts.withLock { $0 } == 3)
    }

    @Test func anotherFailureIsNotTriedAgain() async throws {
        let attempts = Mutex(0)
        await #expect(throws: Refused(attempt: 1)) {
            try await LocalPostgresCluster.onFreshPorts(logger: TestDatabase.logger) { () async throws -> Int in
                throw Refused(attempt: attempts.withLock { $0 += 1; return $0 })
            }
        }
        #expect(attempts.withLock { $0 } == 1)
    }
}
