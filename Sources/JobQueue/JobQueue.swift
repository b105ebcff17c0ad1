import Foundation
package import Postgres

/// Every statement the worker and the CLI run against `siwa.jobs`, in one place.
///
/// Fencing: a claim sets `state = 'running'` and grows `attempt`; every later write of that run
/// says `WHERE id = … AND state = 'running' AND attempt = …`. A worker whose lease expired (and whose
/// job was rescued or claimed again) matches nothing, so it can neither complete nor fail the job.
/// Each write returns whether it matched.
package struct JobQueue: Sendable {
    package let pool: PostgresPool

    package init(pool: PostgresPool) {
        self.pool = pool
    }

    // MARK: Claiming

    /// Columns decoded by `job(from:)`.
    package static let jobColumns = """
        j.id, j.kind, j.client_id, j.sub, j.notification_jti, j.args::text AS args, j.attempt, j.max_attempts,
        jsonb_array_length(j.errors) AS error_count, j.created_at
        """

    /// Claims up to `limit` due jobs of the Apple-calling kinds (everything but `notification` and
    /// `webhook`, which have claims of their own), oldest first by (priority, run_at, id), skipping rows
    /// other workers hold and jobs of paused client IDs (`siwa.claim_call_jobs`, planned once a session).
    package static func claimQuery(worker: String, limit: Int, lease: Duration) -> PostgresQuery {
        """
        SELECT id, kind, client_id, sub, notification_jti, args, attempt, max_attempts, error_count, created_at
          FROM siwa.claim_call_jobs(\(worker)::text, \(limit)::integer, \(lease.seconds))
        """
    }

    package func claim(worker: String, limit: Int, lease: Duration) async throws -> [Job] {
        guard limit > 0 else { return [] }
        let rows = try await pool.withConnection { try await $0.query(Self.claimQuery(worker: worker, limit: limit, lease: lease)) }
        return try rows.map(Self.job(from:)).sorted { $0.id < $1.id }
    }

    package static func job(from row: PostgresRow) throws -> Job {
        let kindText = try row.decode(String.self, column: "kind")
        guard let kind = JobKind(rawValue: kindText) else {
            throw PostgresError(.decodingFailed, message: "unknown job kind \"\(kindText)\"", column: "kind")
        }
        return Job(
            id: try row.decode(Int64.self, column: "id"), kind: kind,
            clientID: try row.decode(String.self, column: "client_id"), sub: try row.decode(String.self, column: "sub"),
            notificationJTI: try row.decode(String?.self, column: "notification_jti"),
            argumentsJSON: try row.decode(String.self, column: "args"), attempt: try row.decode(Int.self, column: "attempt"),
            maxAttempts: try row.decode(Int.self, column: "max_attempts"),
            errorCount: try row.decode(Int.self, column: "error_count"),
            createdAt: try row.decode(Date.self, column: "created_at"))
    }

    // Jobs are queued by the SQL functions of their effects, in `sql/functions/`: the notification
    // trigger, `siwa.link_account`, `siwa.request_deletion`, `siwa.queue_reconciles`, the webhook trigger.

    // MARK: Notifications (the hot path)

    /// One claimed notification job, as `siwa.run_notification_batch` reports it.
    package struct NotificationResult: Sendable, Equatable {
        package var jobID: Int64
        package var jti: String?
        /// `applied`, `no_change`, `stale`, … (nil when it failed).
        package var outcome: String?
        package var error: String?
        /// `completed`, `available` (retry scheduled), `discarded`, or `lost` (fence did not match).
        package var state: String
        /// received_at → applied, when known.
        package var delaySeconds: Double?
    }

    /// Claims, applies and completes up to `limit` notification jobs in one statement (one
    /// transaction). The fast path uses no subtransactions; if any job raises, the batch is rolled
    /// back and run again with one subtransaction per job, so only the failing job is retried.
    package func runNotificationBatch(
        worker: String, limit: Int, lease: Duration, policy: RetryPolicy
    ) async throws -> [NotificationResult] {
        try await pool.withConnection { connection in
            do {
                return try await Self.runNotificationBatch(
                    on: connection, worker: worker, limit: limit, lease: lease, policy: policy, isolate: false)
            } catch let error as PostgresError where error.code == .queryFailed {
                return try await Self.runNotificationBatch(
                    on: connection, worker: worker, limit: limit, lease: lease, policy: policy, isolate: true)
            }
        }
    }

    package static func runNotificationBatch(
        on connection: PostgresConnection, worker: String, limit: Int, lease: Duration, policy: RetryPolicy,
        isolate: Bool, verified: [Int64] = [], skipBusyAccounts: Bool = false
    ) async throws -> [NotificationResult] {
        try notificationResults(
            try await connection.query(
                notificationBatchQuery(
                    worker: worker, limit: limit, lease: lease, policy: policy, isolate: isolate, verified: verified,
                    skipBusyAccounts: skipBusyAccounts)))
    }

    /// The batch's statement (`siwa.run_notification_batch`): claims, applies and completes up to
    /// `limit` notification jobs, the `verified` held ones (locked by the caller's transaction) first.
    /// `skipBusyAccounts`: due jobs only of users no other batch is taking, as the held read.
    package static func notificationBatchQuery(
        worker: String, limit: Int, lease: Duration, policy: RetryPolicy, isolate: Bool, verified: [Int64],
        skipBusyAccounts: Bool = false
    ) -> PostgresQuery {
        """
        SELECT job_id, jti, outcome, error, state, delay_seconds
          FROM siwa.run_notification_batch(\(worker)::text, \(limit)::integer, \(lease.seconds), \(isolate),
                                            \(policy.base.seconds), \(policy.cap.seconds), \(verified)::bigint[],
                                            \(skipBusyAccounts))
        """
    }

    package static func notificationResults(_ rows: PostgresRows) throws -> [NotificationResult] {
        try rows.map { row in
            NotificationResult(
                jobID: try row.decode(Int64.self, column: "job_id"), jti: try row.decode(String?.self, column: "jti"),
                outcome: try row.decode(String?.self, column: "outcome"),
                error: try row.decode(String?.self, column: "error"), state: try row.decode(String.self, column: "state"),
                delaySeconds: try row.decode(Double?.self, column: "delay_seconds"))
        }
    }

    // MARK: Finishing a claimed job (fenced)

    /// Completion, fenced by the lease (`siwa.complete_job`, sql/functions/queue.sql: the one way a
    /// job completes).
    package static func completeQuery(_ job: Job, outcome: String) -> PostgresQuery {
        "SELECT siwa.complete_job(\(job.id), \(job.attempt)::integer, \(outcome))"
    }

    /// For handlers that complete the job in the transaction of their own effect: false means the
    /// lease was lost, and the caller must roll its effect back.
    package static func complete(_ job: Job, outcome: String, on connection: PostgresConnection) async throws -> Bool {
        try await connection.query(completeQuery(job, outcome: outcome))[0].decode(Bool.self, at: 0)
    }

    package func complete(_ job: Job, outcome: String) async throws -> Bool {
        try await pool.withConnection { try await Self.complete(job, outcome: outcome, on: $0) }
    }

    /// Records the error (`siwa.fail_jobs`, sql/functions/queue.sql: the one way a job fails), and
    /// `siwa.job_retry` decides what follows: back to `available` after the backoff of `policy`
    /// (`retryAfter` a floor), or `discarded` once the job's failures reach its max_attempts or at once
    /// when `discard`. Returns what it wrote; nil when the lease was lost.
    package func fail(
        _ job: Job, error: String, retryAfter: Duration?, discard: Bool, policy: RetryPolicy
    ) async throws -> JobWritten? {
        try await pool.withConnection { connection in
            let rows = try await connection.query(
                """
                SELECT state, retry_in
                  FROM siwa.fail_jobs(ARRAY[\(job.id)]::bigint[], ARRAY[\(job.attempt)]::integer[],
                                      ARRAY[\(error)]::text[], ARRAY[\(retryAfter?.seconds)]::float8[],
                                      ARRAY[\(discard)]::boolean[], \(policy.base.seconds), \(policy.cap.seconds))
                """)
            guard let row = rows.first else { return nil }
            guard try row.decode(String.self, column: "state") == "available" else { return .discarded }
            return .retried(after: .milliseconds(Int64(try row.decode(Double.self, column: "retry_in") * 1000)))
        }
    }

    /// Back to `available` at now + `duration` without recording an error (`siwa.snooze_job`).
    package func snooze(_ job: Job, for duration: Duration) async throws -> Bool {
        try await pool.withConnection { connection in
            try await connection.query(
                "SELECT siwa.snooze_job(\(job.id), \(job.attempt)::integer, \(duration.seconds))")[0].decode(Bool.self, at: 0)
        }
    }

    /// Writes what `JobLifecycle.decide` chose, a failure's backoff drawn from `policy`. Returns what
    /// the job became; nil when the lease was lost.
    package func apply(_ action: JobAction, to job: Job, policy: RetryPolicy) async throws -> JobWritten? {
        switch action {
        case .nothing: .completed
        case .complete(let outcome): try await complete(job, outcome: outcome) ? .completed : nil
        case .fail(let error, let retryAfter):
            try await fail(job, error: error, retryAfter: retryAfter, discard: false, policy: policy)
        case .discard(let error): try await fail(job, error: error, retryAfter: nil, discard: true, policy: policy)
        case .snooze(_, let duration): try await snooze(job, for: duration) ? .snoozed : nil
        }
    }

    // MARK: Held notifications (StoredNotificationGate)

    /// Up to `limit` held notification jobs (stored by a `siwa_receiver` login, `run_at` infinity),
    /// locked SKIP LOCKED, with every column the gate checks and the jws, oldest first
    /// (`siwa.held_notification_jobs`, planned once a session). `skipBusyAccounts`: only jobs of
    /// users no other batch is taking (see the function).
    package static func heldNotificationsQuery(limit: Int, skipBusyAccounts: Bool = false) -> PostgresQuery {
        """
        SELECT id, jti, client_id, sub, event_type, event_ms, email, is_private_email, jws
          FROM siwa.held_notification_jobs(\(limit)::integer, \(skipBusyAccounts))
        """
    }

    /// Held notification jobs the gate refused: each notification recorded `forged`, never applied,
    /// and its job completed with that outcome (`siwa.forged_notifications`).
    package static func completeForgedNotifications(_ ids: [Int64], on connection: PostgresConnection) async throws {
        _ = try await connection.query("SELECT siwa.forged_notifications(\(ids))")
    }

    // MARK: Leases

    /// Heartbeat: pushes `locked_until` to now + `lease` for jobs this worker still holds
    /// (`siwa.extend_job_leases`).
    package func extendLeases(_ jobs: [Job], lease: Duration) async throws -> Int {
        guard !jobs.isEmpty else { return 0 }
        return try await pool.withConnection { connection in
            try await connection.query(
                """
                SELECT siwa.extend_job_leases(\(jobs.map(\.id))::bigint[], \(jobs.map { Int64($0.attempt) })::bigint[],
                                              \(lease.seconds))
                """)[0].decode(Int.self, at: 0)
        }
    }

    /// Shutdown: hands jobs this worker still holds back to the queue, due now, no error recorded
    /// (`siwa.release_jobs`).
    package func release(_ jobs: [Job]) async throws -> Int {
        guard !jobs.isEmpty else { return 0 }
        return try await pool.withConnection { connection in
            try await connection.query(
                "SELECT siwa.release_jobs(\(jobs.map(\.id))::bigint[], \(jobs.map { Int64($0.attempt) })::bigint[])"
            )[0].decode(Int.self, at: 0)
        }
    }

    /// A job whose lease ran out with no outcome recorded, as `rescueExpired` left it.
    package struct Rescued: Sendable, Equatable {
        package var jobID: Int64
        package var kind: String
        /// `available` (due now), or `discarded` with the error `process_died` at the third expiry.
        package var state: String
    }

    /// Jobs whose lease expired (their worker died or hung) become available again, or are discarded
    /// with `process_died` when it is the third time (`siwa.rescue_expired_jobs`). Any worker may run
    /// this; the next claim grows `attempt`, which fences the first worker out.
    package func rescueExpired() async throws -> [Rescued] {
        try await pool.withConnection { connection in
            try await connection.query("SELECT job_id, kind, state FROM siwa.rescue_expired_jobs()").map { row in
                Rescued(
                    jobID: try row.decode(Int64.self, column: "job_id"), kind: try row.decode(String.self, column: "kind"),
                    state: try row.decode(String.self, column: "state"))
            }
        }
    }

    // Operator actions (list, retry, cancel) are JobAdministration's: they run by hand, never hold a lease.
    // MARK: Retention of its own rows

    /// Deletes completed and cancelled jobs finalized before now - `age`, at most `batch` rows
    /// (`siwa.prune_completed_jobs`, run by the worker's retention pass, `Retention`). Returns one
    /// row: how many.
    package static func pruneCompletedQuery(olderThan age: Duration, batch: Int) -> PostgresQuery {
        "SELECT siwa.prune_completed_jobs(\(age.seconds), \(batch)::integer)"
    }
}
