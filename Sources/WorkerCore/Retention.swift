internal import JobQueue
internal import Metrics
package import Postgres

/// How long each kind of row is kept, and the one pass that deletes what outlived its purpose. The
/// worker runs `run(on:)` every few minutes; an advisory lock lets one worker at a time do it. Each
/// kind of row is pruned by its owner: the queue's own finished jobs by `JobQueue`, the rest by
/// SQL functions called by name (`siwa.prune_notifications`, `siwa.scrub_discarded_notifications`,
/// `siwa.prune_rejections` in sql/functions/notifications.sql, `siwa.prune_account_changes` in
/// accounts.sql).
package struct Retention: Sendable {
    /// Completed and cancelled jobs (`SIWA_COMPLETED_JOB_RETENTION`).
    package var completedJobs: Duration
    /// Processed notifications, account changes, and the personal data of discarded notifications
    /// (`SIWA_RETENTION_DAYS`).
    package var days: Int
    /// Per-minute rejection counters: `siwa status` shows the last hour.
    package static let rejections: Duration = .seconds(2 * 86_400)
    /// The advisory lock key of the pass (any value no other lock of ours uses).
    package static let lockKey: Int64 = 0x5_1_1A_0002
    /// At most this many rows of each kind a pass.
    package static let batch = 10_000

    package init(completedJobs: Duration, days: Int) {
        self.completedJobs = completedJobs
        self.days = days
    }

    /// What one pass deleted or scrubbed.
    package struct Removed: Sendable, Equatable {
        package var jobs: Int
        package var notifications: Int
        package var rejections: Int
        package var accountChanges: Int
        package var discardedNotificationsScrubbed: Int

        package var isEmpty: Bool {
            jobs == 0 && notifications == 0 && rejections == 0 && accountChanges == 0 && discardedNotificationsScrubbed == 0
        }
    }

    /// One pass in one transaction (at most `batch` rows of each kind); nil when another worker's
    /// pass holds the lock.
    package func run(on pool: PostgresPool) async throws -> Removed? {
        let age: Duration = .seconds(Int64(days) * 86_400)
        return try await pool.withConnection { connection in
            try await connection.withTransaction { connection -> Removed? in
                let lock = try await connection.query("SELECT pg_try_advisory_xact_lock(\(Self.lockKey)) AS locked")
                guard try lock.first?.decode(Bool.self, column: "locked") == true else { return nil }
                func count(_ query: PostgresQuery) async throws -> Int { try await connection.query(query)[0].decode(Int.self, at: 0) }
                return Removed(
                    jobs: try await count(JobQueue.pruneCompletedQuery(olderThan: completedJobs, batch: Self.batch)),
                    notifications: try await count(Self.pruneNotificationsQuery(olderThan: age)),
                    rejections: try await count(Self.pruneRejectionsQuery(olderThan: Self.rejections)),
                    accountChanges: try await count(Self.pruneAccountChangesQuery(olderThan: age)),
                    discardedNotificationsScrubbed: try await count(Self.scrubDiscardedNotificationsQuery(olderThan: age)))
            }
        }
    }

    /// Notifications processed before now - `age`, with their completed or cancelled jobs
    /// (`siwa.prune_notifications`). Returns one row: how many.
    package static func pruneNotificationsQuery(olderThan age: Duration, batch: Int = batch) -> PostgresQuery {
        "SELECT siwa.prune_notifications(\(age.seconds), \(batch)::integer)"
    }

    /// Change rows older than `age` whose webhook delivery is not owed (`siwa.prune_account_changes`).
    package static func pruneAccountChangesQuery(olderThan age: Duration, batch: Int = batch) -> PostgresQuery {
        "SELECT siwa.prune_account_changes(\(age.seconds), \(batch)::integer)"
    }

    /// The personal data of notifications whose job was discarded before now - `age`
    /// (`siwa.scrub_discarded_notifications`).
    package static func scrubDiscardedNotificationsQuery(olderThan age: Duration, batch: Int = batch) -> PostgresQuery {
        "SELECT siwa.scrub_discarded_notifications(\(age.seconds), \(batch)::integer)"
    }

    /// Per-minute rejection counters older than `age` (`siwa.prune_rejections`).
    package static func pruneRejectionsQuery(olderThan age: Duration) -> PostgresQuery {
        "SELECT siwa.prune_rejections(\(age.seconds))"
    }
}
