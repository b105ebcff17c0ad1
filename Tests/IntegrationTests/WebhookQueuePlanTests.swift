import Foundation
import Postgres
import Testing

/// The claim and the result write cost what their batch costs, not what the backlog holds, even on
/// a queue analyzed while empty and filled since (autovacuum's next ANALYZE can be a minute away:
/// every claim meanwhile would otherwise walk the backlog). Measured in buffers the statement
/// touched (EXPLAIN ANALYZE BUFFERS counts the function's own statements), not in time.
@Suite("Webhook queue plans", .serialized)
struct WebhookQueuePlanTests {
    static let queued = 4000

    @Test func claimAndFinishTouchTheirBatchNotTheBacklogOnAQueueAnalyzedEmpty() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            _ = try await connection.execute("INSERT INTO siwa.webhook_endpoint (endpoint) VALUES ('http://127.0.0.1:9/hooks')")
            _ = try await connection.execute("ANALYZE siwa.jobs")
            // 4 changes for each of 1,000 accounts, interleaved as a burst of effects records them.
            _ = try await connection.execute(
                """
                INSERT INTO siwa.account_changes (client_id, sub, app_user_id, change, status)
                SELECT 'com.example.app', 'sub-' || (i % 1000), 'user', 'email_enabled', 'active'
                  FROM generate_series(1, \(Self.queued)) AS i ORDER BY i
                """)

            // Once with nothing to do, so the catalog reads of a first call are not counted below.
            _ = try await connection.query("SELECT * FROM siwa.claim_webhook_deliveries('plan-test', 0, 60)")
            _ = try await connection.query("SELECT * FROM siwa.finish_webhook_deliveries('{}', '{}', '{}', '{}', 86400, 1, 3600)")

            let claim = try await connection.buffersTouched(by: "SELECT * FROM siwa.claim_webhook_deliveries('plan-test', 32, 60)")
            let claimed = try await connection.query(
                "SELECT id, attempt, sub FROM siwa.jobs WHERE kind = 'webhook' AND state = 'running' ORDER BY id")
            #expect(claimed.count == 32)
            #expect(claim < Self.queued / 4, "a claim of 32 touched \(claim) buffers with \(Self.queued) queued")

            // All completed but one retried (within a minute): its account's later changes follow it.
            let ids = try claimed.map { try $0.decode(Int64.self, column: "id") }
            let attempts = try claimed.map { Int64(try $0.decode(Int.self, column: "attempt")) }
            let retriedSub = try claimed[0].decode(String.self, column: "sub")
            let statuses: [Int64] = [503] + Array(repeating: 204, count: ids.count - 1)
            let errors = ["answered 503"] + Array(repeating: "", count: ids.count - 1)
            let finish = try await connection.buffersTouched(
                by: """
                SELECT * FROM siwa.finish_webhook_deliveries(
                    \(ids)::bigint[], \(attempts)::bigint[], \(statuses)::integer[], \(errors)::text[], 86400, 60, 60)
                """)
            #expect(finish < Self.queued / 4, "writing 32 results touched \(finish) buffers with \(Self.queued) queued")
            #expect(try await connection.int("SELECT count(*) FROM siwa.jobs WHERE kind = 'webhook' AND state = 'completed'") == 31)
            // The retried one and its account's 3 later changes, due when it is (the jitter's draw, later than now).
            #expect(try await connection.int(
                """
                SELECT count(*) FROM siwa.jobs s
                 WHERE s.kind = 'webhook' AND s.sub = \(retriedSub)
                   AND s.run_at = (SELECT h.run_at FROM siwa.jobs h WHERE h.id = \(ids[0]) AND h.state = 'available' AND h.run_at > now())
                """) == 4)
        }
    }
}
