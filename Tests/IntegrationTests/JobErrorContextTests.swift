import Foundation
import JobQueue
import Postgres
import Testing
import AppleJobs

/// A job that fails on the database records which operation and which SQLSTATE, so `siwa jobs
/// list` tells an operator a lock timeout from a failover or a missing grant.
@Suite struct JobErrorContextTests {
    @Test func aRevokeBlockedByALockRecordsTheOperationAndSQLState() async throws {
        try await withLifecycle { harness in
            try await harness.linkAccount(sub: "locked-sub")
            let jobID = try await harness.requestDeletion(sub: "locked-sub")

            // Another session holds the account's row; the handler's sessions give up after 300 ms.
            let holder = try await harness.database.connect()
            defer { holder.close() }
            try await holder.simpleQuery(
                "BEGIN; SELECT 1 FROM siwa.accounts WHERE sub = 'locked-sub' FOR UPDATE")
            let url = harness.database.url
            let impatient = url.contains("://")
                ? url + (url.contains("?") ? "&" : "?") + "options=-clock_timeout%3D300"
                : url + " options='-clock_timeout=300'"
            let pool = PostgresPool(conninfo: impatient, size: 1, logger: harness.logger)
            defer { pool.close() }
            let context = try makeAppleJobContext(settings: harness.settings, pool: pool, logger: harness.logger)

            let job = try await harness.claim(jobID)
            let result = await RevokeJobHandler(context: context).run(job, logger: harness.logger)
            guard case .failed(let error, _) = result else {
                Issue.record("expected a failure while the row is locked, got \(result)")
                return
            }
            #expect(error == "database_error: revoke_step (SQLSTATE 55P03)")
            try await holder.simpleQuery("ROLLBACK")
        }
    }
}
