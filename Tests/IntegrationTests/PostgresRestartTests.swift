import Foundation
import LocalPostgres
import Logging
import Postgres
import TestTiming
import Testing

/// Restarts its own cluster (never the shared one other tests use).
@Suite("Reconnecting after a server restart")
struct PostgresRestartTests {
    @Test func poolAndDedicatedConnectionRecover() async throws {
        let clock = ContinuousClock()
        let started = clock.now
        let cluster = try await LocalPostgresCluster.start(logger: TestDatabase.logger)
        let startup = clock.now - started
        defer { cluster.destroyBlocking() }
        #expect(startup < TestTimeScale.scaled(.seconds(60)))
        print("LocalPostgresCluster.start took \(startup)")

        let pool = PostgresPool(conninfo: cluster.url, size: 2, logger: TestDatabase.logger)
        defer { pool.close() }
        let dedicated = try await PostgresConnection.connect(to: cluster.conninfo, logger: TestDatabase.logger)
        defer { dedicated.close() }
        #expect(try await pool.withConnection { try await $0.query("SELECT 1").count } == 1)

        try await cluster.stop()
        for _ in 0..<2 {
            let error = await #expect(throws: PostgresError.self) {
                try await pool.withConnection { try await $0.query("SELECT 1").count }
            }
            #expect(error?.isConnectionProblem == true)
        }
        await #expect(throws: PostgresError.self) { try await dedicated.query("SELECT 1") }
        #expect(!dedicated.isUsable)
        let resetError = await #expect(throws: PostgresError.self) { try await dedicated.resetIfBroken() }
        #expect(resetError?.isConnectionProblem == true)

        try await cluster.startAgain()
        var succeeded = false
        for _ in 0..<3 where !succeeded {
            do {
                succeeded = try await pool.withConnection { try await $0.query("SELECT 1").count } == 1
            } catch let error as PostgresError {
                #expect(error.isConnectionProblem)
            }
        }
        #expect(succeeded)
        #expect(try await dedicated.resetIfBroken() == true)
        #expect(dedicated.isUsable)
        #expect(try await dedicated.query("SELECT 1").count == 1)
        let restartStarted = clock.now
        try await cluster.restart()
        print("LocalPostgresCluster.restart took \(clock.now - restartStarted)")
        // The server told idle connections it was shutting down; the lease probe notices and reconnects.
        #expect(try await pool.withConnection { try await $0.query("SELECT 1").count } == 1)
    }
}
