package import Foundation
package import JobQueue
package import Postgres
import Metrics

/// The SQL side of deliveries (functions in sql/functions/webhooks.sql): register the endpoint,
/// claim each account's oldest undelivered change, report attempts' results fenced by attempt (the
/// database decides what follows), heartbeat.
package struct WebhookQueue: Sendable {
    /// One claimed delivery.
    package struct Delivery: Sendable, Equatable {
        package var jobID: Int64
        /// The lease's fencing token.
        package var attempt: Int
        package var changeID: Int64?
        /// The change object; nil when the change row no longer exists.
        package var body: String?
        package var changeCreatedAt: Date?
    }

    /// What a claimed delivery's attempt got, as the sender reports it; what follows (delivered,
    /// retried when, discarded) is `siwa.finish_webhook_deliveries`'s to decide.
    package enum Attempt: Sendable, Equatable {
        /// The HTTP status answered, and the error text recorded when it is not a 2xx.
        case answered(status: Int, error: String)
        /// No HTTP answer (timeout, connection, TLS): the error text recorded.
        case failed(error: String)
        /// Nothing to send: the change row is gone (deleted by hand).
        case changeMissing
    }

    /// What the database wrote for one delivery.
    package struct Written: Sendable, Equatable {
        /// `completed`, `available` (retried) or `discarded`.
        package var state: String
        /// Seconds until the retry (nil unless retried).
        package var retryIn: Double?
    }

    package let pool: PostgresPool

    package init(pool: PostgresPool) {
        self.pool = pool
    }

    /// Makes the database queue a delivery for every change from now on (idempotent; also the
    /// heartbeat `siwa status` shows).
    package func register(endpoint: String) async throws {
        _ = try await pool.withConnection { try await $0.query("SELECT siwa.register_webhook_endpoint(\(endpoint))") }
    }

    /// The worker's heartbeat on the registration; never re-creates one `siwa webhooks disable` removed
    /// (a worker re-registers only when it starts).
    package func touch() async throws {
        _ = try await pool.withConnection { try await $0.query("SELECT siwa.touch_webhook_endpoint()") }
    }

    /// `siwa webhooks disable`: no delivery is queued for new changes any more, and the queued
    /// (available or discarded) ones are cancelled, kept with outcome `webhooks_disabled`. Returns
    /// how many were cancelled.
    package static func disable(on connection: PostgresConnection) async throws -> Int {
        try await connection.query("SELECT siwa.disable_webhooks()")[0].decode(Int.self, at: 0)
    }

    /// The registered endpoint for `siwa status`, if any.
    package struct Registration: Sendable, Equatable {
        package var endpoint: String
        package var registeredAt: Date
        package var seenAt: Date
    }

    package static func registration(on connection: PostgresConnection) async throws -> Registration? {
        try await connection.query("SELECT endpoint, registered_at, seen_at FROM siwa.webhook_endpoint").first.map { row in
            Registration(
                endpoint: try row.decode(String.self, column: "endpoint"),
                registeredAt: try row.decode(Date.self, column: "registered_at"),
                seenAt: try row.decode(Date.self, column: "seen_at"))
        }
    }

    /// The claim's commit does not wait for the disk (`synchronous_commit` off for its transaction
    /// only): lost in a database crash, it just leaves the job available, to be claimed and sent again
    /// (a crash mid-request, which receivers deduplicate). Results are written synchronously.
    package func claim(worker: String, limit: Int, lease: Duration) async throws -> [Delivery] {
        guard limit > 0 else { return [] }
        let rows = try await pool.withConnection { connection in
            try await connection.query(
                """
                SELECT c.job_id, c.attempt, c.change_id, c.body, c.change_created_at
                  FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit,
                       siwa.claim_webhook_deliveries(\(worker)::text, \(limit)::integer, \(lease.seconds)) AS c
                """)
        }
        return try rows.map { row in
            Delivery(
                jobID: try row.decode(Int64.self, column: "job_id"), attempt: try row.decode(Int.self, column: "attempt"),
                changeID: try row.decode(Int64?.self, column: "change_id"),
                body: try row.decode(String?.self, column: "body"),
                changeCreatedAt: try row.decode(Date?.self, column: "change_created_at"))
        }
    }

    /// Writes the attempts' results in one statement, the database deciding what follows each
    /// (`window`: the retry window since a delivery's first failure; `policy`: the backoff). Returns
    /// what was written by job id; a job missing from it had lost its lease.
    package func finish(
        _ results: [(delivery: Delivery, attempt: Attempt)], window: Duration, policy: RetryPolicy
    ) async throws -> [Int64: Written] {
        guard !results.isEmpty else { return [:] }
        // Arrays bind without NULLs: status 0 is no answer, error "" none.
        var statuses: [Int64] = []
        var errors: [String] = []
        for (_, attempt) in results {
            switch attempt {
            case .answered(let status, let error): statuses.append(Int64(status)); errors.append(error)
            case .failed(let error): statuses.append(0); errors.append(error)
            case .changeMissing: statuses.append(0); errors.append("")
            }
        }
        let ids = results.map(\.delivery.jobID)
        let attempts = results.map { Int64($0.delivery.attempt) }
        let rows = try await pool.withConnection { connection in
            try await connection.query(
                """
                SELECT job_id, state, retry_in FROM siwa.finish_webhook_deliveries(
                    \(ids)::bigint[], \(attempts)::bigint[], \(statuses)::integer[], \(errors)::text[],
                    \(window.seconds)::float8, \(policy.base.seconds)::float8, \(policy.cap.seconds)::float8)
                """)
        }
        var written: [Int64: Written] = [:]
        for row in rows {
            written[try row.decode(Int64.self, column: "job_id")] = Written(
                state: try row.decode(String.self, column: "state"), retryIn: try row.decode(Double?.self, column: "retry_in"))
        }
        return written
    }

    package func extendLeases(_ held: [Delivery], lease: Duration) async throws {
        guard !held.isEmpty else { return }
        let ids = held.map(\.jobID)
        let attempts = held.map { Int64($0.attempt) }
        _ = try await pool.withConnection { connection in
            try await connection.query(
                "SELECT siwa.extend_webhook_leases(\(ids)::bigint[], \(attempts)::bigint[], \(lease.seconds))")
        }
    }

    /// Shutdown: hands unfinished deliveries back, due now, no failure counted.
    package func release(_ held: [Delivery]) async throws -> Int {
        guard !held.isEmpty else { return 0 }
        let ids = held.map(\.jobID)
        let attempts = held.map { Int64($0.attempt) }
        let rows = try await pool.withConnection { connection in
            try await connection.query(
                "SELECT siwa.release_webhook_deliveries(\(ids)::bigint[], \(attempts)::bigint[]) AS released")
        }
        return try rows.first?.decode(Int.self, column: "released") ?? 0
    }

    /// `siwa status` and the worker's gauges.
    package struct Backlog: Sendable, Equatable {
        package var undelivered: Int
        package var oldestSeconds: Double?
        package var failing: Int
        package var discarded: Int
        package var blockedByDiscarded: Int
    }

    package static let backlogQuery: PostgresQuery =
        "SELECT undelivered, oldest_seconds, failing, discarded, blocked_by_discarded FROM siwa.webhook_backlog()"

    package static func backlog(on connection: PostgresConnection) async throws -> Backlog {
        let row = try await connection.query(backlogQuery)[0]
        return Backlog(
            undelivered: try row.decode(Int.self, column: "undelivered"),
            oldestSeconds: try row.decode(Double?.self, column: "oldest_seconds"),
            failing: try row.decode(Int.self, column: "failing"), discarded: try row.decode(Int.self, column: "discarded"),
            blockedByDiscarded: try row.decode(Int.self, column: "blocked_by_discarded"))
    }
}
