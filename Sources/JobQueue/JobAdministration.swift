package import Foundation
package import Postgres

/// Operator actions on `siwa.jobs` for `siwa jobs list/retry/cancel`. Kept apart from the worker's
/// claim/complete SQL: these statements run rarely, by hand, and never hold a lease.
package struct JobAdministration: Sendable {
    /// One row of `siwa jobs list`.
    package struct Row: Sendable, Equatable {
        package var id: Int64
        package var kind: String
        package var state: String
        package var clientID: String
        package var sub: String
        package var attempt: Int
        package var maxAttempts: Int
        package var errorCount: Int
        /// The last recorded error's text (`errors[-1].error`), if any.
        package var lastError: String?
        package var outcome: String?
        package var runAt: Date
        package var createdAt: Date
        package var finalizedAt: Date?
        /// True when this is a revoke whose account is still `pending_deletion`.
        package var guardsPendingDeletion: Bool
    }

    package struct Filter: Sendable {
        /// One job only (`siwa jobs retry ID` checks it exists; the console's `/jobs/{id}`).
        package var id: Int64?
        package var state: String?
        package var kind: String?
        package var sub: String?
        package var limit: Int

        package init(id: Int64? = nil, state: String? = nil, kind: String? = nil, sub: String? = nil, limit: Int = 50) {
            self.id = id
            self.state = state
            self.kind = kind
            self.sub = sub
            self.limit = limit
        }
    }

    /// Which jobs an action applies to.
    package enum Target: Sendable, Equatable {
        case id(Int64)
        /// Every job of this `sub` (any client ID).
        case sub(String)
    }

    package struct CancelResult: Sendable, Equatable {
        /// Jobs now `cancelled`.
        package var cancelled: [Int64] = []
        /// Revokes of pending deletions left alone because `force` was false.
        package var refused: [Int64] = []
        /// Of `cancelled`, the revokes of pending deletions (`force` was true): those accounts stay
        /// `pending_deletion` with no revoke queued until `siwa.request_deletion` is called again.
        package var cancelledPendingDeletions: [Int64] = []
        /// Matched jobs already final (completed, discarded, cancelled).
        package var alreadyFinal: Int = 0
        /// The kind of each job in `cancelled` and `refused`.
        package var kinds: [Int64: String] = [:]
    }

    package static let states = ["available", "running", "completed", "discarded", "cancelled"]
    package static let kinds = ["notification", "exchange", "revoke", "reconcile", "webhook"]

    private let connection: PostgresConnection

    package init(connection: PostgresConnection) {
        self.connection = connection
    }

    // The revoke of an account still pending deletion: cancelling it would drop the deletion.
    /// A revoke of an account still `pending_deletion` (`siwa.guards_pending_deletion`, the account rules').
    private static let pendingDeletionRevokeSQL = "siwa.guards_pending_deletion(j.kind, j.client_id, j.sub)"

    /// Newest first.
    package func list(_ filter: Filter) async throws -> [Row] {
        let rows = try await connection.query(
            """
            SELECT j.id, j.kind, j.state, j.client_id, j.sub, j.attempt, j.max_attempts,
                   jsonb_array_length(j.errors) AS error_count,
                   CASE WHEN jsonb_array_length(j.errors) > 0
                        THEN coalesce(j.errors -> -1 ->> 'error', (j.errors -> -1)::text) END AS last_error,
                   j.outcome, j.run_at, j.created_at, j.finalized_at,
                   \(unsafeSQL: Self.pendingDeletionRevokeSQL) AS guards_pending_deletion
              FROM siwa.jobs j
             WHERE (\(filter.id)::bigint IS NULL OR j.id = \(filter.id)::bigint)
               AND (\(filter.state)::text IS NULL OR j.state = \(filter.state)::text)
               AND (\(filter.kind)::text IS NULL OR j.kind = \(filter.kind)::text)
               AND (\(filter.sub)::text IS NULL OR j.sub = \(filter.sub)::text)
             ORDER BY j.id DESC
             LIMIT \(filter.limit)
            """)
        return try rows.map { row in
            Row(
                id: try row.decode(Int64.self, column: "id"),
                kind: try row.decode(String.self, column: "kind"),
                state: try row.decode(String.self, column: "state"),
                clientID: try row.decode(String.self, column: "client_id"),
                sub: try row.decode(String.self, column: "sub"),
                attempt: try row.decode(Int.self, column: "attempt"),
                maxAttempts: try row.decode(Int.self, column: "max_attempts"),
                errorCount: try row.decode(Int.self, column: "error_count"),
                lastError: try row.decode(String?.self, column: "last_error"),
                outcome: try row.decode(String?.self, column: "outcome"),
                runAt: try row.decode(Date.self, column: "run_at"),
                createdAt: try row.decode(Date.self, column: "created_at"),
                finalizedAt: try row.decode(Date?.self, column: "finalized_at"),
                guardsPendingDeletion: try row.decode(Bool.self, column: "guards_pending_deletion"))
        }
    }

    /// The job with this id, if there is one.
    package func job(_ id: Int64) async throws -> Row? {
        try await list(Filter(id: id, limit: 1)).first
    }

    /// Makes discarded jobs, and available jobs waiting out a retry backoff, available now. Errors
    /// are kept; a job out of attempts gets one more (river's `JobRetry`): discarding counts errors,
    /// not attempts. A job discarded as `process_died` starts counting expired leases afresh.
    /// Returns the ids retried.
    /// Cancelled jobs are not retried: an operator or `siwa webhooks disable` stopped them on purpose,
    /// and a cancelled exchange no longer holds its authorization code.
    package func retry(_ target: Target, kind: String? = nil) async throws -> [Int64] {
        try await retryReturningKinds(target, kind: kind).map(\.id)
    }

    /// `retry`, with each retried job's kind.
    package func retryReturningKinds(_ target: Target, kind: String? = nil) async throws -> [(id: Int64, kind: String)] {
        let rows = try await connection.query(
            """
            UPDATE siwa.jobs
               SET state = 'available', run_at = now(), finalized_at = NULL, outcome = NULL,
                   locked_by = NULL, locked_until = NULL, expired_leases = 0,
                   max_attempts = greatest(max_attempts, jsonb_array_length(errors) + 1)
             WHERE (\(target.id)::bigint IS NULL OR id = \(target.id)::bigint)
               AND (\(target.sub)::text IS NULL OR sub = \(target.sub)::text)
               AND (\(kind)::text IS NULL OR kind = \(kind)::text)
               AND (state = 'discarded' OR (state = 'available' AND jsonb_array_length(errors) > 0))
            RETURNING id, kind
            """)
        return try rows.map { (try $0.decode(Int64.self, column: "id"), try $0.decode(String.self, column: "kind")) }
            .sorted { $0.id < $1.id }
    }

    /// Cancels the matched jobs that are not final (available or running; a running job's worker
    /// loses its lease check and cannot complete it). A revoke whose account is still
    /// `pending_deletion` is cancelled only with `force`, and the cancellation is recorded in
    /// `siwa.account_changes` so it is never silent.
    package func cancel(_ target: Target, kind: String? = nil, force: Bool) async throws -> CancelResult {
        try await connection.withTransaction { connection in
            let matched = try await connection.query(
                """
                SELECT j.id, j.kind, j.state, j.client_id, j.sub,
                       \(unsafeSQL: Self.pendingDeletionRevokeSQL) AS guards_pending_deletion
                  FROM siwa.jobs j
                 WHERE (\(target.id)::bigint IS NULL OR j.id = \(target.id)::bigint)
                   AND (\(target.sub)::text IS NULL OR j.sub = \(target.sub)::text)
                   AND (\(kind)::text IS NULL OR j.kind = \(kind)::text)
                 ORDER BY j.id
                   FOR UPDATE OF j
                """)
            var result = CancelResult()
            for row in matched {
                let id = try row.decode(Int64.self, column: "id")
                let state = try row.decode(String.self, column: "state")
                guard state == "available" || state == "running" else {
                    result.alreadyFinal += 1
                    continue
                }
                result.kinds[id] = try row.decode(String.self, column: "kind")
                let guardsDeletion = try row.decode(Bool.self, column: "guards_pending_deletion")
                if guardsDeletion && !force {
                    result.refused.append(id)
                    continue
                }
                _ = try await connection.execute(
                    """
                    UPDATE siwa.jobs
                       SET state = 'cancelled', finalized_at = now(), locked_by = NULL, locked_until = NULL,
                           outcome = 'cancelled_by_operator', args = args - 'code'
                     WHERE id = \(id)
                    """)
                result.cancelled.append(id)
                if guardsDeletion {
                    result.cancelledPendingDeletions.append(id)
                    let clientID = try row.decode(String.self, column: "client_id")
                    let sub = try row.decode(String.self, column: "sub")
                    _ = try await connection.query(
                        """
                        SELECT siwa.record_change(\(clientID), \(sub), 'deletion_revoke_cancelled',
                                                  'revoke job cancelled by an operator (--force)', NULL, \(id))
                        """)
                }
            }
            return result
        }
    }
}

extension JobAdministration.Target {
    var id: Int64? {
        if case .id(let id) = self { return id }
        return nil
    }

    var sub: String? {
        if case .sub(let sub) = self { return sub }
        return nil
    }
}
