import Foundation
import Logging
import Postgres
import TestTiming

/// Helpers for the worker tests: queue notifications the way the receiver stores them, run real
/// `siwa-worker` processes, and poll the database (never sleep-and-hope).
extension MigratedDatabase {
    /// The receiver's INSERT; the statement trigger queues one job per row. `types` cycles per row;
    /// each row gets its own sub unless `sub` is given.
    @discardableResult
    func queueNotifications(
        _ count: Int, prefix: String = "n", clientID: String = "com.example.app", sub: String? = nil,
        types: [String] = ["email-enabled", "email-disabled", "consent-revoked", "account-deleted"],
        eventTime: String = "now() - interval '1 hour' + i * interval '1 ms'", on connection: PostgresConnection
    ) async throws -> Int {
        try await connection.execute(
            """
            INSERT INTO siwa.notifications (jti, client_id, sub, event_type, event_time, email, is_private_email, claims, jws)
            SELECT \(prefix) || i, \(clientID)::text, coalesce(\(sub)::text, \(prefix) || '-sub-' || i),
                   (\(types)::text[])[1 + i % \(types.count)], \(unsafeSQL: eventTime),
                   'x@privaterelay.appleid.com', true, '{}'::jsonb, 'header.payload.signature'
              FROM generate_series(1, \(count)) AS i
            """)
    }

    /// An account `sub` (active) whose row another transaction holds (FOR UPDATE) until the
    /// returned connection rolls back; the caller closes it.
    func holdAccount(_ sub: String, on connection: PostgresConnection) async throws -> PostgresConnection {
        try await connection.execute(
            "INSERT INTO siwa.accounts (client_id, sub, status) VALUES ('com.example.app', \(sub), 'active')")
        let blocker = try await connect()
        try await blocker.simpleQuery("BEGIN")
        _ = try await blocker.query("SELECT 1 FROM siwa.accounts WHERE sub = \(sub) FOR UPDATE")
        return blocker
    }

    func startWorker(_ extra: [String: String] = [:]) throws -> ServiceProcess {
        try ServiceProcess(
            "siwa-worker",
            environment: [
                "DATABASE_URL": url, "SIWA_CLIENT_IDS": "com.example.app", "SIWA_APPLE_CALLS": "disabled",
                "SIWA_OPS_LISTEN": "127.0.0.1:0", "SIWA_LOG_LEVEL": "info", "SIWA_JOB_LEASE": "2s",
                "SIWA_POLL_INTERVAL": "200ms", "SIWA_SHUTDOWN_GRACE": "3s",
            ].merging(extra) { _, new in new })
    }
}

extension PostgresConnection {
    func int(_ query: PostgresQuery) async throws -> Int {
        try await self.query(query).first!.decode(Int.self, at: 0)
    }

    /// Shared buffers (hit or read) `query` touched, run under EXPLAIN ANALYZE: the statements of
    /// the functions it calls are counted too. What a statement costs in work, not in time.
    func buffersTouched(by query: PostgresQuery) async throws -> Int {
        var explained = query
        explained.sql = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query.sql
        let text = try await self.query(explained)[0].decode(String.self, column: "QUERY PLAN")
        guard let plans = try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [[String: Any]],
            let plan = plans.first?["Plan"] as? [String: Any]
        else { throw ServiceProcessError(message: "EXPLAIN gave no plan for \(query.sql): \(text)") }
        return (plan["Shared Hit Blocks"] as? Int ?? 0) + (plan["Shared Read Blocks"] as? Int ?? 0)
    }

    /// Rows `query` read from each siwa table (sequentially or through an index, kept or filtered
    /// out), by the table's counters for this transaction: call it inside one (BEGIN), where
    /// nothing flushes them. Unlike buffers, this counts a plan that filters every row of a small,
    /// dense index.
    func rowsRead(by query: PostgresQuery) async throws -> (rows: PostgresRows, read: [String: Int]) {
        let counters: PostgresQuery = """
            SELECT relname, (seq_tup_read + coalesce(idx_tup_fetch, 0))::int8 AS read
              FROM pg_stat_xact_user_tables WHERE schemaname = 'siwa'
            """
        func read() async throws -> [String: Int] {
            Dictionary(uniqueKeysWithValues: try await self.query(counters).map {
                (try $0.decode(String.self, column: "relname"), try $0.decode(Int.self, column: "read"))
            })
        }
        let before = try await read()
        let rows = try await self.query(query)
        let after = try await read()
        return (rows, after.reduce(into: [:]) { $0[$1.key] = $1.value - (before[$1.key] ?? 0) })
    }

    /// Polls `query` (one integer) until `done` says so, or fails after `timeout` with the last value.
    @discardableResult
    func waitFor(
        _ query: PostgresQuery, timeout: Duration = .seconds(15), sourceLocation: String = #function,
        until done: (Int) -> Bool
    ) async throws -> Int {
        var value = 0
        try await waitUntil("\(sourceLocation): \(query.sql) gives the value awaited", timeout: timeout, every: .milliseconds(25), detail: "last \(value)") {
            value = try await int(query)
            return done(value)
        }
        return value
    }

    /// Waits until the account `sub` of the end-to-end stack's app has status `wanted`.
    func waitForStatus(_ sub: String, _ wanted: String, timeout: Duration = .seconds(15)) async throws {
        try await waitFor(
            "SELECT count(*) FROM siwa.accounts WHERE client_id = \(EndToEndStack.clientID) AND sub = \(sub) AND status = \(wanted)",
            timeout: timeout, sourceLocation: "\(sub) becoming \(wanted)"
        ) { $0 == 1 }
    }

    /// The invariants every worker test ends with: each notification processed, each job completed,
    /// at most one account change per notification, and one per applied effect.
    func expectExactlyOnce(total: Int) async throws -> (processed: Int, applied: Int, changes: Int, notCompleted: Int, duplicates: Int) {
        let row = try await query(
            """
            SELECT (SELECT count(*) FROM siwa.notifications WHERE processed_at IS NOT NULL) AS processed,
                   (SELECT count(*) FROM siwa.notifications WHERE outcome = 'applied') AS applied,
                   (SELECT count(*) FROM siwa.account_changes WHERE notification_jti IS NOT NULL) AS changes,
                   (SELECT count(*) FROM siwa.jobs WHERE kind = 'notification' AND state <> 'completed') AS not_completed,
                   (SELECT count(*) FROM (SELECT notification_jti FROM siwa.account_changes
                     WHERE notification_jti IS NOT NULL GROUP BY 1 HAVING count(*) > 1) d) AS duplicates
            """
        ).first!
        return (
            try row.decode(Int.self, column: "processed"), try row.decode(Int.self, column: "applied"),
            try row.decode(Int.self, column: "changes"), try row.decode(Int.self, column: "not_completed"),
            try row.decode(Int.self, column: "duplicates")
        )
    }
}

let processedCount: PostgresQuery = "SELECT count(*) FROM siwa.notifications WHERE processed_at IS NOT NULL"
