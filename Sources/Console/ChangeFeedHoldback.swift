package import Postgres

/// A transaction that has written account changes and stays open: until it ends, the change feed
/// serves nothing past the ids it may hold (an app that began a transaction, called
/// `siwa.request_deletion` and left it open, say).
package struct ChangeFeedHoldback: Sendable {
    /// Open longer than the feed waits for writers (1 s by default), so a reader got less than it
    /// could: the workers' own batches take milliseconds.
    package static let threshold = 1.0

    /// nil: a prepared transaction (it has no session).
    package var pid: Int32?
    /// nil: when it began is hidden from this role (pg_stat_activity shows other logins' sessions
    /// only to pg_read_all_stats); it was seen open at least `threshold` apart.
    package var seconds: Double?
    package var application: String?
    package var role: String?

    package static func load(_ connection: PostgresConnection) async throws -> ChangeFeedHoldback? {
        let writers = try await connection.query(
            """
            SELECT w.virtualtransaction, w.pid, a.application_name, coalesce(a.usename, p.owner) AS role,
                   extract(epoch FROM clock_timestamp() - coalesce(a.xact_start, p.prepared))::float8 AS seconds
              FROM siwa.change_writers() w
              LEFT JOIN pg_stat_activity a ON a.pid = w.pid
              LEFT JOIN pg_prepared_xacts p ON w.pid IS NULL AND w.virtualtransaction = '-1/' || p.transaction
             ORDER BY seconds DESC NULLS LAST
            """
        ).map { row in
            (
                transaction: try row.decode(String.self, column: "virtualtransaction"),
                holdback: ChangeFeedHoldback(
                    pid: try row.decode(Int32?.self, column: "pid"), seconds: try row.decode(Double?.self, column: "seconds"),
                    application: try row.decode(String?.self, column: "application_name"),
                    role: try row.decode(String?.self, column: "role"))
            )
        }
        if let oldest = writers.first, let seconds = oldest.holdback.seconds, seconds >= threshold { return oldest.holdback }
        // Writers whose start this role cannot see: the ones still open a threshold later were
        // open at least that long (pg_locks is read live, not from the transaction's snapshot).
        let hidden = writers.filter { $0.holdback.seconds == nil }
        guard !hidden.isEmpty else { return nil }
        try await Task.sleep(for: .seconds(threshold))
        let stillOpen = Set(
            try await connection.query(
                "SELECT virtualtransaction FROM siwa.change_writers() WHERE virtualtransaction = ANY (\(hidden.map(\.transaction)))"
            ).map { try $0.decode(String.self, at: 0) })
        return hidden.first { stillOpen.contains($0.transaction) }?.holdback
    }
}
