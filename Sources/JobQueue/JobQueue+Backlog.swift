package import Postgres

/// What is waiting in `siwa.jobs`, read by the worker's gauges and by `siwa status`: both show the
/// same numbers because both read them here.
extension JobQueue {
    package struct Backlog: Sendable, Equatable {
        /// Available jobs already due (a held notification, `run_at` infinity, is not due).
        package var ready: Int
        /// How long the oldest due job has waited; nil when none is due.
        package var oldestReadySeconds: Double?
        /// Age of the oldest revoke not yet finished (a deletion waiting on Apple); nil when none.
        package var oldestPendingRevokeSeconds: Double?
        package var pausedClients: Int
    }

    /// One pass over the jobs not yet final.
    package static func backlog(on connection: PostgresConnection) async throws -> Backlog {
        let row = try await connection.query(
            """
            SELECT count(*) FILTER (WHERE state = 'available' AND run_at <= now()) AS ready,
                   extract(epoch FROM now() - min(run_at) FILTER (WHERE state = 'available' AND run_at <= now()))::float8
                       AS oldest_ready,
                   extract(epoch FROM now() - min(created_at) FILTER (WHERE kind = 'revoke'))::float8 AS oldest_revoke,
                   (SELECT count(*) FROM siwa.paused_clients) AS paused
              FROM siwa.jobs WHERE state IN ('available', 'running')
            """)[0]
        return Backlog(
            ready: try row.decode(Int.self, column: "ready"),
            oldestReadySeconds: try row.decode(Double?.self, column: "oldest_ready"),
            oldestPendingRevokeSeconds: try row.decode(Double?.self, column: "oldest_revoke"),
            pausedClients: try row.decode(Int.self, column: "paused"))
    }

    /// counts[kind][state], every kind and state present (zero when no such job).
    package static func countsByKindAndState(on connection: PostgresConnection) async throws -> [String: [String: Int]] {
        var counts: [String: [String: Int]] = [:]
        for kind in JobAdministration.kinds {
            counts[kind] = Dictionary(uniqueKeysWithValues: JobAdministration.states.map { ($0, 0) })
        }
        for row in try await connection.query("SELECT kind, state, count(*) AS n FROM siwa.jobs GROUP BY kind, state") {
            counts[try row.decode(String.self, column: "kind"), default: [:]][try row.decode(String.self, column: "state")] =
                try row.decode(Int.self, column: "n")
        }
        return counts
    }

    /// Discarded jobs whose last error is `process_died` (their process died running them three
    /// times, `siwa.rescue_expired_jobs`). (How many of them hold up a deletion: `siwa.deletion_backlog`.)
    package static func processDied(on connection: PostgresConnection) async throws -> Int {
        try await connection.query(
            """
            SELECT count(*) AS jobs FROM siwa.jobs j
             WHERE j.state = 'discarded' AND j.errors -> -1 ->> 'error' = 'process_died'
            """)[0].decode(Int.self, column: "jobs")
    }
}
