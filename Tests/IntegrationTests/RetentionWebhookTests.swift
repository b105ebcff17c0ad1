import Foundation
import JobQueue
import Postgres
import Testing
import WorkerCore

/// Retention and webhooks interleaved: a change whose delivery is still owed outlives
/// `SIWA_RETENTION_DAYS`, or its webhook would find nothing to send.
@Suite struct RetentionWebhookTests {
    @Test func aChangeWithAnOwedDeliveryIsNotPruned() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            try await connection.simpleQuery(
                """
                INSERT INTO siwa.account_changes (client_id, sub, change, status, created_at) VALUES
                  ('com.example.app', 'owed', 'consent_revoked', 'consent_revoked', now() - interval '40 days'),
                  ('com.example.app', 'sent', 'consent_revoked', 'consent_revoked', now() - interval '40 days'),
                  ('com.example.app', 'recent', 'consent_revoked', 'consent_revoked', now());
                -- Whether or not an endpoint is registered, the deliveries as the trigger writes them:
                DELETE FROM siwa.jobs WHERE kind = 'webhook';
                INSERT INTO siwa.jobs (kind, priority, client_id, sub, args, state)
                SELECT 'webhook', 3, c.client_id, c.sub, jsonb_build_object('change_id', c.id),
                       CASE c.sub WHEN 'owed' THEN 'discarded' ELSE 'completed' END
                  FROM siwa.account_changes c WHERE c.sub IN ('owed', 'sent');
                """)
            _ = try await connection.query(Retention.pruneAccountChangesQuery(olderThan: .seconds(30 * 86_400)))[0].decode(Int.self, at: 0)
            let left = try await connection.query("SELECT sub FROM siwa.account_changes ORDER BY sub")
                .map { try $0.decode(String.self, at: 0) }
            #expect(left == ["owed", "recent"])
        }
    }
}
