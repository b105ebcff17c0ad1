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

    /// Newest first (`siwa.list_jobs`; `guards_pending_deletion`: a revoke of an account still
    /// `pending_deletion`, which cancelling would drop).
    package func list(_ filter: Filter) async throws -> [Row] {
        let rows = try await connection.query(
            """
            SELECT id, kind, state, client_id, sub, attempt, max_attempts, error_count, last_error, outcome, run_at,
                   created_at, finalized_at, guards_pending_deletion
              FROM siwa.list_jobs(\(filter.id)::bigint, \(filter.state)::text, \(filter.kind)::text, \(filter.sub)::text,
                                  \(filter.limit)::integer)
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
            "SELECT id, kind FROM siwa.retry_jobs(\(target.id)::bigint, \(target.sub)::text, \(kind)::text)")
        return try rows.map { (try $0.decode(Int64.self, column: "id"), try $0.decode(String.self, column: "kind")) }
            .sorted { $0.id < $1.id }
    }

    /// Cancels the matched jobs that are not final (available or running; a running job's worker
    /// loses its lease check and cannot complete it). A revoke whose account is still
    /// `pending_deletion` is cancelled only with `force`, and the cancellation is recorded in
    /// `siwa.account_changes` so it is never silent (`siwa.cancel_jobs`, one statement).
    package func cancel(_ target: Target, kind: String? = nil, force: Bool) async throws -> CancelResult {
        let rows = try await connection.query(
            "SELECT id, kind, result FROM siwa.cancel_jobs(\(target.id)::bigint, \(target.sub)::text, \(kind)::text, \(force))")
        var result = CancelResult()
        for row in rows {
            let id = try row.decode(Int64.self, column: "id")
            switch try row.decode(String.self, column: "result") {
            case "already_final":
                result.alreadyFinal += 1
                continue
            case "refused": result.refused.append(id)
            case "cancelled_pending_deletion":
                result.cancelled.append(id)
                result.cancelledPendingDeletions.append(id)
            default: result.cancelled.append(id)
            }
            result.kinds[id] = try row.decode(String.self, column: "kind")
        }
        return result
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
