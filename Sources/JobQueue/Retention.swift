package import Postgres

/// How long each kind of row is kept, and the one pass that deletes what outlived its purpose. The
/// worker runs `run(on:)` every few minutes; an advisory lock lets one worker at a time do it.
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

    /// One pass in one transaction (at most 10,000 rows of each kind); nil when another worker's
    /// pass holds the lock.
    package func run(on pool: PostgresPool) async throws -> Removed? {
        let age: Duration = .seconds(Int64(days) * 86_400)
        return try await pool.withConnection { connection in
            try await connection.withTransaction { connection -> Removed? in
                let lock = try await connection.query("SELECT pg_try_advisory_xact_lock(\(Self.lockKey)) AS locked")
                guard try lock.first?.decode(Bool.self, column: "locked") == true else { return nil }
                return Removed(
                    jobs: try await connection.execute(Self.pruneCompletedQuery(olderThan: completedJobs)),
                    notifications: try await connection.execute(Self.pruneNotificationsQuery(olderThan: age)),
                    rejections: try await connection.execute(Self.pruneRejectionsQuery(olderThan: Self.rejections)),
                    accountChanges: try await connection.execute(Self.pruneAccountChangesQuery(olderThan: age)),
                    discardedNotificationsScrubbed: try await connection.execute(
                        Self.scrubDiscardedNotificationsQuery(olderThan: age)))
            }
        }
    }

    /// Deletes completed and cancelled jobs finalized before now - `age`, at most `batch` rows.
    package static func pruneCompletedQuery(olderThan age: Duration, batch: Int = 10_000) -> PostgresQuery {
        """
        DELETE FROM siwa.jobs WHERE id IN (
            SELECT id FROM siwa.jobs
             WHERE finalized_at < now() - make_interval(secs => \(age.seconds))
               AND state IN ('completed', 'cancelled')
             LIMIT \(batch))
        """
    }

    /// Deletes notifications processed before now - `age` (at most `batch`), with their completed or
    /// cancelled jobs, in one statement. Discarded jobs are kept (an operator may still retry them;
    /// the effect then reports `missing`).
    package static func pruneNotificationsQuery(olderThan age: Duration, batch: Int = 10_000) -> PostgresQuery {
        """
        WITH victims AS (
            SELECT jti FROM siwa.notifications
             WHERE processed_at < now() - make_interval(secs => \(age.seconds))
             LIMIT \(batch)
        ), jobs AS (
            DELETE FROM siwa.jobs WHERE notification_jti IN (SELECT jti FROM victims)
               AND state IN ('completed', 'cancelled')
        )
        DELETE FROM siwa.notifications WHERE jti IN (SELECT jti FROM victims)
        """
    }

    /// Change rows older than `age` (the app reads them as they come; `SIWA_RETENTION_DAYS`),
    /// except those whose webhook delivery is still owed (queued, in flight, or discarded and
    /// waiting for `siwa jobs retry`): pruning them would turn the delivery into a lost change.
    package static func pruneAccountChangesQuery(olderThan age: Duration, batch: Int = 10_000) -> PostgresQuery {
        """
        DELETE FROM siwa.account_changes WHERE id IN (
            SELECT c.id FROM siwa.account_changes c
             WHERE c.created_at < now() - make_interval(secs => \(age.seconds))
               AND NOT EXISTS (
                   SELECT 1 FROM siwa.jobs j
                    WHERE j.kind = 'webhook' AND j.state IN ('available', 'running', 'discarded')
                      AND j.client_id = c.client_id AND j.sub = c.sub
                      AND (j.args->>'change_id')::bigint = c.id)
             LIMIT \(batch))
        """
    }

    /// Notifications whose job was discarded more than `age` ago stay (an operator may still retry
    /// them) without their personal data: email, the signed token, the events claim.
    package static func scrubDiscardedNotificationsQuery(olderThan age: Duration, batch: Int = 10_000) -> PostgresQuery {
        """
        UPDATE siwa.notifications n SET email = NULL, jws = NULL, claims = n.claims - 'events'
          FROM (SELECT j.notification_jti FROM siwa.jobs j
                 WHERE j.finalized_at < now() - make_interval(secs => \(age.seconds))
                   AND j.state = 'discarded' AND j.kind = 'notification'
                 LIMIT \(batch)) d
         WHERE n.jti = d.notification_jti
           AND (n.email IS NOT NULL OR n.jws IS NOT NULL OR n.claims ? 'events')
        """
    }

    /// Per-minute rejection counters older than `age`.
    package static func pruneRejectionsQuery(olderThan age: Duration) -> PostgresQuery {
        "DELETE FROM siwa.rejections WHERE minute < now() - make_interval(secs => \(age.seconds))"
    }
}
