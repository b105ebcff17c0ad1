import CryptoCore
import Foundation
import Postgres

/// Known rows for the console's pages, written as the database owner (no worker runs, so jobs
/// stay as written), and every secret they hold, so a test can check no page shows one.
struct ConsoleFixture: Sendable {
    static let clientID = "com.example.app"
    /// A `sub` and an `app_user_id` that would run a script if a page printed them unescaped.
    static let scriptSub = "000111.<script>alert(1)</script>"
    static let scriptUser = "<script>alert('u')</script>&\"x\""
    static let deletingSub = "000222.deleting.0001"
    static let pausedClient = "com.example.paused"

    /// What the rows hold that no page may show.
    static let code = "c_console_fixture_code_7d1f0e"
    static let refreshToken = "r_console_fixture_refresh_token_93ab"
    static let jws = "eyJhbGciOiJSUzI1NiIsImtpZCI6ImNvbnNvbGUifQ.eyJzdWIiOiJzZWNyZXQifQ.c2lnbmF0dXJlLWNvbnNvbGU"
    static let nonce = "n_console_fixture_nonce_51c2"

    static var secrets: [String] {
        [code, refreshToken, jws, nonce, Data(refreshToken.utf8).base64EncodedString(),
         SHA256.hash(Array(nonce.utf8)).map { String(format: "%02x", $0) }.joined()]
    }

    var discardedExchange: Int64
    var availableNotificationJob: Int64
    var pendingRevoke: Int64

    static func write(_ db: PostgresConnection) async throws -> ConsoleFixture {
        let attempts = #"[{"attempt":1,"at":"2026-12-01T10:00:00Z","error":"http_503"},{"attempt":2,"at":"2026-12-01T10:00:02Z","error":"invalid_grant"}]"#
        _ = try await db.execute(
            """
            INSERT INTO siwa.accounts (client_id, sub, app_user_id, status, email, is_private_email, refresh_token_enc, linked_at)
            VALUES (\(clientID), \(scriptSub), \(scriptUser), 'active', 'x@privaterelay.appleid.com', true, \(Array(refreshToken.utf8)), now() - interval '2 hours'),
                   (\(clientID), \(deletingSub), 'user-deleting', 'active', NULL, NULL, \(Array(refreshToken.utf8)), now() - interval '1 day')
            """)
        _ = try await db.execute(
            """
            INSERT INTO siwa.account_changes (client_id, sub, app_user_id, change, status, created_at)
            VALUES (\(clientID), \(scriptSub), \(scriptUser), 'linked', 'active', now() - interval '2 hours')
            """)
        let discarded = try await db.query(
            """
            INSERT INTO siwa.jobs (kind, state, client_id, sub, args, attempt, errors, finalized_at)
            VALUES ('exchange', 'discarded', \(clientID), \(scriptSub), jsonb_build_object('code', \(code)::text), 2,
                    \(attempts)::jsonb, now())
            RETURNING id
            """)[0].decode(Int64.self, at: 0)
        // Two notifications: one applied an hour ago's minute, one not processed yet (its job waits).
        _ = try await db.execute(
            """
            INSERT INTO siwa.notifications (jti, client_id, sub, event_type, event_time, email, claims, jws, received_at, processed_at, outcome)
            VALUES ('jti-console-1', \(clientID), \(scriptSub), 'email-enabled', now() - interval '40 minutes', 'x@privaterelay.appleid.com',
                    '{}'::jsonb, \(jws), now() - interval '39 minutes', now() - interval '39 minutes', 'applied')
            """)
        _ = try await db.execute("UPDATE siwa.jobs SET state = 'completed', finalized_at = now() WHERE notification_jti = 'jti-console-1'")
        _ = try await db.execute(
            """
            INSERT INTO siwa.notifications (jti, client_id, sub, event_type, event_time, claims, jws)
            VALUES ('jti-console-2', \(clientID), \(scriptSub), 'email-disabled', now(), '{}'::jsonb, \(jws))
            """)
        let notificationJob = try await db.query(
            "SELECT id FROM siwa.jobs WHERE notification_jti = 'jti-console-2'")[0].decode(Int64.self, at: 0)
        // A deletion whose revoke Apple answered 503 five times; the next try in 3.5 hours (the page
        // says "3 h" however slowly a loaded machine gets there).
        let revoke = try await db.query("SELECT siwa.request_deletion(\(clientID), \(deletingSub))")[0].decode(Int64.self, at: 0)
        _ = try await db.execute(
            """
            UPDATE siwa.jobs SET attempt = 5, run_at = now() + interval '210 minutes',
                   errors = (SELECT jsonb_agg(jsonb_build_object('attempt', n, 'at', now() - make_interval(secs => 60 - n), 'error', 'http_503'))
                               FROM generate_series(1, 5) AS n)
             WHERE id = \(revoke)
            """)
        _ = try await db.execute("INSERT INTO siwa.rejections (minute, reason, count) VALUES (date_trunc('minute', now()), 'bad_signature', 3)")
        _ = try await db.execute(
            "INSERT INTO siwa.paused_clients (client_id, reason, next_probe_at) VALUES (\(pausedClient), 'invalid_client', now() + interval '5 minutes')")
        _ = try await db.execute(
            "INSERT INTO siwa.sign_in_nonces (nonce_hash, expires_at) VALUES (\(SHA256.hash(Array(nonce.utf8))), now() + interval '5 minutes')")
        return ConsoleFixture(discardedExchange: discarded, availableNotificationJob: notificationJob, pendingRevoke: revoke)
    }
}
