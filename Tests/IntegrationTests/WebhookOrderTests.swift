import Foundation
import Postgres
import Testing

/// Order per account under interleaved writers: the claim sends an account's lowest undelivered
/// change id first, so ids of one account must be taken in the order their transactions commit.
/// A writer that records a change without holding the account's row lets another writer take a
/// later id and commit first: its change would be sent before the earlier, still uncommitted one.
@Suite struct WebhookOrderTests {
    @Test func aLaterChangeOfTheAccountWaitsForAnEarlierUncommittedOne() async throws {
        try await withMigratedDatabase { database in
            let setup = try await database.connect()
            let first = try await database.connect()
            let second = try await database.connect()
            defer { for connection in [setup, first, second] { connection.close() } }
            try await setup.simpleQuery(
                """
                INSERT INTO siwa.webhook_endpoint (endpoint) VALUES ('http://127.0.0.1:9/hooks');
                INSERT INTO siwa.accounts (client_id, sub, app_user_id, status) VALUES ('com.example.app', 'raced', 'u1', 'active');
                INSERT INTO siwa.jobs (kind, priority, client_id, sub, args, state, attempt)
                VALUES ('exchange', 0, 'com.example.app', 'raced', '{"code": "c", "purpose": "link"}', 'running', 1);
                """)
            let exchange = try await setup.int("SELECT id FROM siwa.jobs WHERE kind = 'exchange'")

            // The link's exchange fails: `link_failed` is recorded, not yet committed.
            try await first.simpleQuery("BEGIN")
            #expect(try await first.query("SELECT siwa.exchange_failed(\(Int64(exchange)), 1, 'invalid_grant')")
                .first!.decode(Bool.self, at: 0))
            // Meanwhile the app asks for the account's deletion, in its own transaction.
            let deletion = Task { try await second.query("SELECT siwa.request_deletion('com.example.app', 'raced')") }
            // Either it commits at once, or it waits for the first writer's lock: wait for one of the two.
            try await setup.waitFor(
                """
                SELECT (SELECT count(*) FROM siwa.account_changes WHERE change = 'deletion_requested')
                     + (SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database())
                """) { $0 > 0 }
            let whileOpen = try await setup.query("SELECT change_id FROM siwa.claim_webhook_deliveries('order-test', 10, 60)")
                .map { try $0.decode(Int64.self, at: 0) }
            #expect(whileOpen.isEmpty, "claimed change \(whileOpen) while the account's earlier change was uncommitted")

            try await first.simpleQuery("COMMIT")
            _ = try await deletion.value
            let changes = try await setup.query("SELECT change FROM siwa.account_changes WHERE sub = 'raced' ORDER BY id")
                .map { try $0.decode(String.self, at: 0) }
            #expect(changes == ["link_failed", "deletion_requested"], "ids follow commit order per account")
        }
    }
}
