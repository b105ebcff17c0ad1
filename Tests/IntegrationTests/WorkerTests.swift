import Foundation
import JobQueue
import Logging
import Postgres
import Testing
import WorkerCore

#if canImport(Glibc)
    import Glibc
#endif

/// Real `siwa-worker` processes against a real PostgreSQL, `SIWA_APPLE_CALLS=disabled`.
@Suite("Worker processes", .serialized)
struct WorkerTests {
    @Test func twoWorkersApplyTwoThousandNotificationsExactlyOnce() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            let first = try database.startWorker()
            let second = try database.startWorker()
            try await database.queueNotifications(2000, on: connection)
            try await connection.waitFor(processedCount) { $0 == 2000 }
            try await connection.waitFor("SELECT count(*) FROM siwa.jobs WHERE state <> 'completed'") { $0 == 0 }
            let result = try await connection.expectExactlyOnce(total: 2000)
            #expect(result.processed == 2000)
            #expect(result.applied == 2000)  // every sub is fresh: each event changes its account
            #expect(result.changes == result.applied)
            #expect(result.duplicates == 0)
            #expect(result.notCompleted == 0)
            // Both processes took part (SKIP LOCKED splits the backlog).
            let workers = try await connection.int("SELECT count(DISTINCT locked_by) FROM siwa.jobs")
            #expect(workers == 0)  // completion clears locked_by
            await first.stop()
            await second.stop()
            #expect(!first.log.contains("\"level\":\"error\""), "\(first.log)")
        }
    }

    @Test func killedWorkerLosesNothingAndAppliesNothingTwice() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            try await database.queueNotifications(500, on: connection)
            // A job leased by a worker that died (lease running out in 2 s): rescue must free it.
            try await database.queueNotifications(1, prefix: "leased", on: connection)
            try await connection.execute(
                """
                UPDATE siwa.jobs SET state = 'running', attempt = 1, locked_by = 'dead-worker',
                       locked_until = now() + interval '1 second'
                 WHERE notification_jti = 'leased1'
                """)
            let victim = try database.startWorker(["SIWA_NOTIFICATION_BATCH": "5"])
            try await connection.waitFor(processedCount, timeout: .seconds(10)) { $0 > 0 }
            victim.signal(SIGKILL)
            _ = await victim.waitForExit(timeout: .seconds(5))
            let survivor = try database.startWorker()
            try await connection.waitFor(processedCount) { $0 == 501 }
            try await connection.waitFor("SELECT count(*) FROM siwa.jobs WHERE state <> 'completed'") { $0 == 0 }
            let result = try await connection.expectExactlyOnce(total: 501)
            #expect(result.duplicates == 0)
            #expect(result.changes == result.applied)
            #expect(result.applied == 501)
            await survivor.stop()
        }
    }

    @Test func lateAndDuplicateEmailEventsDoNotMoveStateBackwards() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            let worker = try database.startWorker()
            // enabled at t=2 arrives and is processed first.
            try await database.queueNotifications(
                1, prefix: "enabled-t2-", sub: "alice", types: ["email-enabled"],
                eventTime: "timestamptz '2026-01-01 00:00:02+00'", on: connection)
            try await connection.waitFor(processedCount) { $0 == 1 }
            // disabled at t=1 comes late; the same enabled event comes again under a new jti.
            try await database.queueNotifications(
                1, prefix: "disabled-t1-", sub: "alice", types: ["email-disabled"],
                eventTime: "timestamptz '2026-01-01 00:00:01+00'", on: connection)
            try await connection.waitFor(processedCount) { $0 == 2 }
            try await database.queueNotifications(
                1, prefix: "enabled-again-", sub: "alice", types: ["email-enabled"],
                eventTime: "timestamptz '2026-01-01 00:00:02+00'", on: connection)
            try await connection.waitFor(processedCount) { $0 == 3 }

            let forwarding = try await connection.query(
                "SELECT email_forwarding FROM siwa.accounts WHERE sub = 'alice'"
            ).first!.decode(String.self, at: 0)
            #expect(forwarding == "enabled")
            let outcomes = try await connection.query("SELECT jti, outcome FROM siwa.notifications ORDER BY jti")
            let byJTI = Dictionary(uniqueKeysWithValues: try outcomes.map {
                (try $0.decode(String.self, at: 0), try $0.decode(String.self, at: 1))
            })
            #expect(byJTI == ["enabled-t2-1": "applied", "disabled-t1-1": "stale", "enabled-again-1": "no_change"])
            #expect(try await connection.int("SELECT count(*) FROM siwa.account_changes") == 1)
            await worker.stop()
        }
    }

    @Test func sigtermMidBatchLosesNothing() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            try await database.queueNotifications(3000, on: connection)
            // An Apple-calling job with no handler (calls disabled): snoozed, never dropped.
            _ = try await connection.query("SELECT siwa.request_deletion('com.example.app', 'bob')")
            let worker = try database.startWorker(["SIWA_NOTIFICATION_BATCH": "10"])
            try await connection.waitFor(processedCount, timeout: .seconds(10)) { $0 > 0 }
            worker.signal(SIGTERM)
            let status = await worker.waitForExit(timeout: .seconds(10))
            #expect(status == 0, "\(worker.log.suffix(2000))")
            #expect(worker.log.contains("siwa-worker stopped"))
            // Nothing is left leased, and what was processed is completed.
            #expect(try await connection.int("SELECT count(*) FROM siwa.jobs WHERE state = 'running'") == 0)
            let processed = try await connection.int(processedCount)
            let completed = try await connection.int(
                "SELECT count(*) FROM siwa.jobs WHERE kind = 'notification' AND state = 'completed'")
            #expect(processed == completed)
            let revoke = try await connection.query("SELECT state, jsonb_array_length(errors) FROM siwa.jobs WHERE kind = 'revoke'")
            #expect(try revoke.first?.decode(String.self, at: 0) == "available")
            #expect(try revoke.first?.decode(Int.self, at: 1) == 0)

            let next = try database.startWorker()
            try await connection.waitFor(processedCount) { $0 == 3000 }
            try await connection.waitFor(
                "SELECT count(*) FROM siwa.jobs WHERE kind = 'notification' AND state <> 'completed'") { $0 == 0 }
            let result = try await connection.expectExactlyOnce(total: 3000)
            #expect(result.duplicates == 0)
            #expect(result.changes == result.applied)
            await next.stop()
        }
    }

    /// A worker without Apple credentials (SIWA_APPLE_CALLS=disabled) never claims an Apple-calling
    /// job: the revoke waits untouched (attempt 0, due now) for a worker that can run it. Before, it
    /// was claimed and snoozed for a minute, so a capable worker beside it could not revoke it sooner.
    @Test func aWorkerWithoutAppleCredentialsLeavesAppleJobsUntouched() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            _ = try await connection.query("SELECT siwa.request_deletion('com.example.app', 'bob')")
            let worker = try database.startWorker()
            // The worker is serving: a notification queued after its start is applied.
            try await database.queueNotifications(1, on: connection)
            try await connection.waitFor(processedCount) { $0 == 1 }
            // A negative, so an observation window: five of its poll intervals (200 ms) after it
            // proved it runs; the old dispatch loop claimed at its first pass, right at start.
            try await Task.sleep(for: .seconds(1))
            let revoke = try await connection.query(
                "SELECT state, attempt, run_at <= now() FROM siwa.jobs WHERE kind = 'revoke'")
            #expect(try revoke.first?.decode(String.self, at: 0) == "available")
            #expect(try revoke.first?.decode(Int.self, at: 1) == 0)
            #expect(try revoke.first?.decode(Bool.self, at: 2) == true)
            #expect(!worker.log.contains("has no handler"))
            #expect(worker.log.contains("jobs wait until a worker with Apple credentials runs"))
            await worker.stop()
        }
    }

    /// A batch does not wait on an account another transaction holds: with one notification loop
    /// (SIWA_NOTIFICATION_CONNECTIONS=1), the busy account's job is left queued while the rest of
    /// its batch is applied, and it is applied, once, when the lock is gone. (Before, the batch
    /// waited on the row lock and took the other notification's effect down with it.)
    @Test func aBusyAccountsJobIsDeferredNotWaitedFor() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            let blocker = try await database.holdAccount("held", on: connection)
            defer { blocker.close() }
            try await database.queueNotifications(1, prefix: "held", sub: "held", on: connection)
            try await database.queueNotifications(1, prefix: "free", on: connection)
            let worker = try database.startWorker(["SIWA_NOTIFICATION_CONNECTIONS": "1", "SIWA_POLL_INTERVAL": "100ms"])
            try await connection.waitFor(
                "SELECT count(*) FROM siwa.notifications WHERE jti = 'free1' AND processed_at IS NOT NULL") { $0 == 1 }
            #expect(try await connection.int("SELECT count(*) FROM siwa.notifications WHERE jti = 'held1' AND processed_at IS NULL") == 1)
            #expect(try await connection.int(
                "SELECT count(*) FROM siwa.jobs WHERE notification_jti = 'held1' AND state = 'available' AND attempt = 0") == 1)
            try await blocker.simpleQuery("ROLLBACK")
            try await connection.waitFor(processedCount) { $0 == 2 }
            let result = try await connection.expectExactlyOnce(total: 2)
            #expect(result.duplicates == 0)
            await worker.stop()
        }
    }

    @Test func pollOnlyWorkerDrainsTheQueue() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            let worker = try database.startWorker(["SIWA_LISTEN_NOTIFY": "false", "SIWA_POLL_INTERVAL": "100ms"])
            // Started and past its first look at the queue; then jobs arrive with no NOTIFY heard.
            _ = try await worker.firstLogLine("siwa-worker started", timeout: .seconds(20)) { $0.contains("siwa-worker started") ? true : nil }
            try await Task.sleep(for: .milliseconds(300))
            try await database.queueNotifications(700, on: connection)
            try await connection.waitFor(processedCount) { $0 == 700 }
            try await connection.waitFor("SELECT count(*) FROM siwa.jobs WHERE state <> 'completed'") { $0 == 0 }
            #expect(!worker.log.contains("siwa-worker listen"))
            await worker.stop()
        }
    }

    @Test func badConfigurationExitsTwoWithOneLine() async throws {
        let worker = try ServiceProcess(
            "siwa-worker", environment: ["DATABASE_URL": "postgresql://x@127.0.0.1:1/x", "SIWA_CLIENT_IDS": "a"])
        #expect(await worker.waitForExit() == 2)
        #expect(worker.log.contains("SIWA_TEAM_ID"))
        let badKeys = try ServiceProcess(
            "siwa-worker",
            environment: [
                "DATABASE_URL": "postgresql://x@127.0.0.1:1/x", "SIWA_CLIENT_IDS": "a", "SIWA_APPLE_CALLS": "disabled",
                "SIWA_TOKEN_KEYS": "k1:c2hvcnQ=",
            ])
        #expect(await badKeys.waitForExit() == 2)
        #expect(badKeys.log.contains("SIWA_TOKEN_KEYS"))
    }
}

/// The JobQueue library against a real database: fencing, rescue, retry (what `siwa jobs` uses).
/// Nested so it is serialized with the process tests: concurrent migrations race on 003's CREATE ROLE.
extension WorkerTests {
@Suite("Worker JobQueue library")
struct JobQueueLibrary {
    /// `siwa.wake_workers` names the loops that have work (`JobWakeUp`): stored notifications wake
    /// notification loops only, a deletion request the Apple-calling loop, a change with a webhook
    /// endpoint registered the dispatcher. Each woke all three before, and every notification
    /// stored cost an empty claim of Apple-calling jobs.
    @Test func wakeUpsNameTheKindsOfJobQueued() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            let listener = try await database.connect()
            defer {
                connection.close()
                listener.close()
            }
            try await listener.listen("siwa_jobs")
            func heard() async throws -> JobWakeUp {
                JobWakeUp(try await listener.waitForNotifications(timeout: .seconds(5)))
            }
            try await database.queueNotifications(3, on: connection)
            #expect(try await heard() == JobWakeUp(notificationJobs: 3))
            _ = try await connection.query("SELECT siwa.request_deletion('com.example.app', 'carol')")
            #expect(try await heard() == JobWakeUp(calls: true))
            try await connection.execute("INSERT INTO siwa.webhook_endpoint (endpoint) VALUES ('http://127.0.0.1:9/hooks')")
            try await connection.execute(
                """
                INSERT INTO siwa.account_changes (client_id, sub, app_user_id, change, status)
                VALUES ('com.example.app', 'dave', 'user-dave', 'email_enabled', 'active')
                """)
            #expect(try await heard() == JobWakeUp(webhooks: true))
        }
    }

    @Test func fencedCompletionRejectsTheFirstWorkerAfterRescue() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            let pool = PostgresPool(conninfo: database.url, size: 2, logger: TestDatabase.logger)
            defer { pool.close() }
            let queue = JobQueue(pool: pool)
            _ = try await connection.query("SELECT siwa.request_deletion('com.example.app', 'carol')")
            let first = try await queue.claim(worker: "a", limit: 10, lease: .seconds(60))
            #expect(first.count == 1)
            #expect(first[0].kind == .revoke && first[0].attempt == 1)
            #expect(try await queue.claim(worker: "b", limit: 10, lease: .seconds(60)).isEmpty)
            // The lease runs out; any worker rescues; another claims it (attempt 2).
            try await connection.execute("UPDATE siwa.jobs SET locked_until = now() - interval '1 second'")
            #expect(try await queue.rescueExpired().map(\.state) == ["available"])
            let second = try await queue.claim(worker: "b", limit: 10, lease: .seconds(60))
            #expect(second.first?.attempt == 2)
            #expect(try await queue.complete(first[0], outcome: "late") == false)
            #expect(try await queue.extendLeases(first, lease: .seconds(60)) == 0)
            #expect(try await queue.complete(second[0], outcome: "revoked") == true)
            #expect(try await connection.query("SELECT outcome FROM siwa.jobs").first?.decode(String.self, at: 0) == "revoked")
        }
    }

    @Test func failureBackoffDiscardAndOperatorRetry() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            let pool = PostgresPool(conninfo: database.url, size: 2, logger: TestDatabase.logger)
            defer { pool.close() }
            let queue = JobQueue(pool: pool)
            _ = try await connection.query("SELECT siwa.link_account('com.example.app', 'dave', 'user-1', 'code-1')")
            try await connection.execute("UPDATE siwa.jobs SET max_attempts = 2")
            let policy = RetryPolicy(base: .milliseconds(1), cap: .milliseconds(1))
            var job = try await queue.claim(worker: "a", limit: 1, lease: .seconds(60))[0]
            let firstAction = JobLifecycle.decide(.failed(error: "503 from Apple"))
            let first = try await queue.apply(firstAction, to: job, policy: policy)
            guard case .retried(let after) = first, after <= .milliseconds(1) else {
                Issue.record("the first failure of two is retried within the 1 ms backoff, was \(String(describing: first))")
                return
            }
            try await connection.waitFor("SELECT count(*) FROM siwa.jobs WHERE run_at <= now() AND state = 'available'") { $0 == 1 }
            job = try await queue.claim(worker: "a", limit: 1, lease: .seconds(60))[0]
            #expect(job.errorCount == 1)
            // Its second failure of two: siwa.job_retry discards it.
            #expect(try await queue.apply(JobLifecycle.decide(.failed(error: "503 again")), to: job, policy: policy) == .discarded)
            // What an operator does next: `siwa jobs list/retry/cancel` (JobAdministration).
            let admin = JobAdministration(connection: connection)
            var listed = try await admin.list(.init(state: "discarded"))
            #expect(listed.count == 1)
            #expect(listed.first?.lastError == "503 again")
            #expect(listed.first?.errorCount == 2)

            #expect(try await admin.retry(.id(listed[0].id)) == [listed[0].id])
            listed = try await admin.list(.init(sub: "dave"))
            #expect(listed.first?.state == "available")
            #expect(listed.first?.maxAttempts == 3)  // one more try on top of the recorded errors
            #expect(try await admin.retry(.id(999_999)) == [])

            // retry by sub brings back every discarded job of the account.
            job = try await queue.claim(worker: "a", limit: 1, lease: .seconds(60))[0]
            #expect(try await queue.apply(.discard(error: "bad code"), to: job, policy: policy) == .discarded)
            #expect(try await admin.retry(.sub("dave")) == [job.id])
            #expect(try await admin.retry(.sub("nobody")) == [])
            #expect(try await admin.cancel(.id(job.id), force: false).cancelled == [job.id])
            #expect(try await admin.list(.init(state: "cancelled")).count == 1)
        }
    }

    /// One batch holding several events of one account, queued out of event_time order: the
    /// set-based fast path and the per-job fallback both apply them in event_time order, and a
    /// deletion in the middle of the batch erases the account's personal data.
    /// siwa.run_notification_batch with a busy account (another transaction holds its row), in both
    /// paths: every event of that account is reported `deferred` and left as it was (job available,
    /// attempt unchanged, notification unprocessed), a verified held job among them is released
    /// (not verified again), the other jobs complete, and a held job passed as verified is applied
    /// and completed in the same transaction.
    @Test(arguments: [false, true])
    func aBatchDefersTheEventsOfABusyAccountAndAppliesTheRest(isolate: Bool) async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            let blocker = try await database.connect()
            defer { blocker.close() }
            let pool = PostgresPool(conninfo: database.url, size: 1, logger: TestDatabase.logger)
            defer { pool.close() }
            try await connection.execute(
                "INSERT INTO siwa.accounts (client_id, sub, status) VALUES ('com.example.app', 'busy', 'active')")
            _ = try await database.queueNotifications(2, prefix: "busy-", sub: "busy", types: ["email-enabled"], on: connection)
            _ = try await database.queueNotifications(2, prefix: "free-", types: ["email-enabled"], on: connection)
            // Held as a receiver login's would be: one for the busy account, one for a free one.
            try await connection.execute(
                "UPDATE siwa.jobs SET run_at = 'infinity' WHERE notification_jti IN ('busy-1', 'free-1')")
            try await blocker.simpleQuery("BEGIN")
            _ = try await blocker.query("SELECT 1 FROM siwa.accounts WHERE sub = 'busy' FOR UPDATE")
            let results = try await pool.withConnection { connection in
                // Bounded: a batch that waited on the busy account (as before) fails with 55P03.
                try await connection.simpleQuery("SET lock_timeout = '5s'")
                return try await connection.withTransaction { connection in
                    let held = try await connection.query(
                        "SELECT id FROM siwa.jobs WHERE run_at = 'infinity' ORDER BY id FOR UPDATE"
                    ).map { try $0.decode(Int64.self, at: 0) }
                    return try await JobQueue.runNotificationBatch(
                        on: connection, worker: "w", limit: 50, lease: .seconds(60),
                        policy: RetryPolicy(base: .seconds(1), cap: .seconds(1)), isolate: isolate, verified: held)
                }
            }
            let states = Dictionary(uniqueKeysWithValues: results.map { ($0.jti ?? "", $0.state) })
            #expect(states == ["busy-1": "deferred", "busy-2": "deferred", "free-1": "completed", "free-2": "completed"])
            try await blocker.simpleQuery("ROLLBACK")
            #expect(try await connection.int(
                """
                SELECT count(*) FROM siwa.jobs j JOIN siwa.notifications n ON n.jti = j.notification_jti
                 WHERE n.sub = 'busy' AND j.state = 'available' AND j.attempt = 0 AND j.run_at < 'infinity'
                   AND n.processed_at IS NULL
                """) == 2)
            #expect(try await connection.int(
                "SELECT count(*) FROM siwa.jobs WHERE state = 'completed' AND run_at < 'infinity'") == 2)
            #expect(try await connection.int("SELECT count(*) FROM siwa.account_changes WHERE sub = 'busy'") == 0)
            // The lock gone, the next batch applies them, once.
            let next = try await pool.withConnection { connection in
                try await JobQueue.runNotificationBatch(
                    on: connection, worker: "w", limit: 50, lease: .seconds(60),
                    policy: RetryPolicy(base: .seconds(1), cap: .seconds(1)), isolate: isolate)
            }
            #expect(next.map(\.state) == ["completed", "completed"])
            #expect(try await connection.int("SELECT count(*) FROM siwa.account_changes WHERE sub = 'busy'") == 2)
        }
    }

    @Test(arguments: [false, true])
    func oneBatchAppliesAnAccountsEventsInEventTimeOrder(isolate: Bool) async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            let pool = PostgresPool(conninfo: database.url, size: 1, logger: TestDatabase.logger)
            defer { pool.close() }
            func queue(_ jti: String, _ sub: String, _ type: String, second: Int) async throws {
                _ = try await database.queueNotifications(
                    1, prefix: jti, sub: sub, types: [type],
                    eventTime: "timestamptz '2026-01-01 00:00:00+00' + interval '\(second) s'", on: connection)
            }
            // Jobs in this (claim) order; event times say otherwise.
            try await queue("late-disabled-", "erin", "email-disabled", second: 3)
            try await queue("early-enabled-", "erin", "email-enabled", second: 1)
            try await queue("second-enabled-", "erin", "email-enabled", second: 2)
            try await queue("deleted-", "frank", "account-deleted", second: 5)
            try await queue("before-delete-", "frank", "email-enabled", second: 4)
            try await queue("after-delete-", "frank", "email-disabled", second: 6)
            try await queue("mystery-", "frank", "something-new", second: 7)
            let results = try await pool.withConnection { connection in
                try await JobQueue.runNotificationBatch(
                    on: connection, worker: "w", limit: 50, lease: .seconds(60),
                    policy: RetryPolicy(base: .seconds(1), cap: .seconds(1)), isolate: isolate)
            }
            #expect(results.count == 7)
            #expect(results.allSatisfy { $0.state == "completed" })
            let outcomes = Dictionary(uniqueKeysWithValues: results.map { ($0.jti ?? "", $0.outcome ?? "") })
            #expect(outcomes == [
                "early-enabled-1": "applied", "second-enabled-1": "applied", "late-disabled-1": "applied",
                "before-delete-1": "applied", "deleted-1": "applied", "after-delete-1": "ignored_account_deleted",
                "mystery-1": "ignored_unknown_type",
            ])
            let changes = try await connection.query(
                "SELECT sub, change, status FROM siwa.account_changes ORDER BY id"
            ).map { "\(try $0.decode(String.self, at: 0)) \(try $0.decode(String.self, at: 1)) \(try $0.decode(String.self, at: 2))" }
            #expect(changes.filter { $0.hasPrefix("erin") } == [
                "erin email_enabled active", "erin email_enabled active", "erin email_disabled active",
            ])
            #expect(changes.filter { $0.hasPrefix("frank") } == [
                "frank email_enabled active", "frank apple_account_deleted apple_account_deleted",
            ])
            let erin = try await connection.query(
                "SELECT email_forwarding, last_email_event_at = timestamptz '2026-01-01 00:00:03+00' FROM siwa.accounts WHERE sub = 'erin'")
            #expect(try erin.first?.decode(String.self, at: 0) == "disabled")
            #expect(try erin.first?.decode(Bool.self, at: 1) == true)
            // frank's personal data is gone, from the account and from every notification.
            #expect(try await connection.int(
                "SELECT count(*) FROM siwa.accounts WHERE sub = 'frank' AND email IS NULL AND status = 'apple_account_deleted'") == 1)
            #expect(try await connection.int(
                "SELECT count(*) FROM siwa.notifications WHERE sub = 'frank' AND (email IS NOT NULL OR jws IS NOT NULL)") == 0)
            #expect(try await connection.int("SELECT count(*) FROM siwa.notifications WHERE sub = 'erin' AND jws IS NULL") == 0)
        }
    }

    /// The gate's read of held jobs costs what it reads, not the queue's history, once most of a
    /// backlog analyzed while held has completed. Written `= 'infinity' ORDER BY id`, it walked the
    /// primary key past every completed job (21,761 buffers for 10 rows here; 132 this way). The
    /// first call of a session also reads the catalogs, so it is not counted; the later ones run
    /// the plan the session made once and kept.
    @Test func heldReadStaysOnTheClaimIndexAsTheBacklogCompletes() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            try await database.queueNotifications(20_000, on: connection)
            try await connection.simpleQuery("UPDATE siwa.jobs SET run_at = 'infinity'; ANALYZE siwa.jobs; ANALYZE siwa.notifications")
            try await connection.simpleQuery("UPDATE siwa.jobs SET state = 'completed' WHERE id <= 18000")
            for run in 0...2 {
                try await connection.simpleQuery("BEGIN")
                let buffers = try await connection.buffersTouched(by: JobQueue.heldNotificationsQuery(limit: 10))
                try await connection.simpleQuery("ROLLBACK")
                #expect(run == 0 || buffers < 1_000, "run \(run): reading 10 held jobs touched \(buffers) buffers with 18,000 completed")
            }
            try await connection.simpleQuery("BEGIN")
            let held = try await connection.query(JobQueue.heldNotificationsQuery(limit: 10))
            try await connection.simpleQuery("ROLLBACK")
            #expect(try held.map { try $0.decode(Int64.self, column: "id") } == Array(18_001...18_010))
        }
    }

    /// The gate's read and the batch it feeds read their batch, not the backlog, in sessions that
    /// planned them while the queue was near empty (the plans are kept for the session, and
    /// autovacuum's next ANALYZE can be a minute away). Seen in deploy/bench/worker.sh's steady
    /// run: every effect 60 s late. The held read is written so that no plan can walk a table per
    /// job (it joined each job to a walk of the whole notifications index: 819,062 buffers for 250
    /// jobs); the batch's statements are not all so (unnest joined to a table estimated at one row
    /// becomes the table scanned once per array element, or the other way round), so the worker
    /// makes the session's plans again before a batch far larger than they were made for
    /// (`SessionPlans`): without that, the batch here read 8,502 job rows and 2 million
    /// notification comparisons for 250 jobs. `reader` plans its read on the empty queue,
    /// `batcher` both statements with two jobs queued, as a worker's sessions do.
    @Test func heldReadAndBatchPlannedOnAnEmptyQueueReadTheirBatchAsItFills() async throws {
        try await withMigratedDatabase { database in
            let reader = try await database.connect()
            defer { reader.close() }
            let batcher = try await database.connect()
            defer { batcher.close() }
            let hold: PostgresQuery = "UPDATE siwa.jobs SET run_at = 'infinity' WHERE state = 'available' AND kind = 'notification'"
            try await reader.simpleQuery("ANALYZE siwa.jobs; ANALYZE siwa.notifications; ANALYZE siwa.accounts")
            try await reader.simpleQuery("BEGIN")
            #expect(try await reader.query(JobQueue.heldNotificationsQuery(limit: 250)).count == 0)
            try await reader.simpleQuery("ROLLBACK")

            try await database.queueNotifications(2, prefix: "small", on: batcher)
            _ = try await batcher.execute(hold)
            let policy = RetryPolicy(base: .seconds(1), cap: .seconds(60))
            var plans = SessionPlans()
            let session = SessionPlans.Session(batcher)
            // As Worker.verifiedNotificationBatch does: the read, the refresh when the rule says,
            // the batch, in one transaction.
            func heldThenBatch() async throws -> (held: [String: Int], batch: [String: Int], applied: Int, refreshed: Bool) {
                try await batcher.simpleQuery("BEGIN")
                let held = try await batcher.rowsRead(by: JobQueue.heldNotificationsQuery(limit: 250))
                let ids = try held.rows.map { try $0.decode(Int64.self, column: "id") }
                let refreshed = plans.shouldRefresh(session, before: ids.count, at: .now)
                if refreshed { try await batcher.simpleQuery(SessionPlans.refreshSQL) }
                let batch = try await batcher.rowsRead(
                    by: JobQueue.notificationBatchQuery(
                        worker: "plan-test", limit: 250, lease: .seconds(60), policy: policy, isolate: false, verified: ids))
                try await batcher.simpleQuery("COMMIT")
                plans.record(session, taken: batch.rows.count)
                return (held.read, batch.read, batch.rows.count, refreshed)
            }
            let small = try await heldThenBatch()
            #expect(small.applied == 2 && !small.refreshed)

            let queued = 8_000
            try await database.queueNotifications(queued, on: batcher)
            _ = try await batcher.execute(hold)
            try await reader.simpleQuery("BEGIN")
            let read = try await reader.rowsRead(by: JobQueue.heldNotificationsQuery(limit: 250))
            try await reader.simpleQuery("ROLLBACK")
            #expect(read.rows.count == 250)
            #expect(read.read["notifications", default: 0] <= 2 * 250, "the held read planned on an empty queue read \(read.read) with \(queued) held")
            #expect(read.read["jobs", default: 0] <= 2 * 250, "the held read planned on an empty queue read \(read.read) with \(queued) held")

            let large = try await heldThenBatch()
            #expect(large.applied == 250 && large.refreshed)
            #expect(large.held["notifications", default: 0] <= 2 * 250, "the held read read \(large.held) with \(queued) held")
            // Each job read about twice (by key, then its completion); each notification a few
            // times (its own, its account's earlier ones); a plan made for two rows reads the
            // backlog for every batch.
            #expect(large.batch["jobs", default: 0] <= 3 * 250, "a batch of 250 verified jobs read \(large.batch) with \(queued) held")
            #expect(large.batch["notifications", default: 0] <= 10 * 250, "a batch of 250 verified jobs read \(large.batch) with \(queued) held")
        }
    }

    /// Both claims stay on their indexes after the table was analyzed empty and then filled. The
    /// call claim touches 18 buffers after its session's first call (which reads the catalogs);
    /// a sequential scan of the 20,000 notification jobs would touch several hundred.
    @Test func claimStaysAnIndexScanAfterTheTableWasAnalyzedEmpty() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            try await connection.simpleQuery("ANALYZE siwa.jobs; ANALYZE siwa.notifications")
            try await database.queueNotifications(20_000, on: connection)
            try await connection.simpleQuery("SELECT siwa.link_account('com.example.app', 'e', 'u', 'c')")
            let notificationPlan = try await connection.query(
                """
                EXPLAIN SELECT j.id FROM siwa.jobs j
                 WHERE j.state = 'available' AND j.kind = 'notification' AND j.run_at <= now()
                 ORDER BY j.priority, j.run_at, j.id LIMIT 50 FOR UPDATE SKIP LOCKED
                """
            ).map { try $0.decode(String.self, at: 0) }.joined(separator: "\n")
            #expect(notificationPlan.contains("Index Scan using jobs_claim_notification"), "\(notificationPlan)")
            for run in 0...2 {
                try await connection.simpleQuery("BEGIN")
                let buffers = try await connection.buffersTouched(
                    by: JobQueue.claimQuery(worker: "w", limit: 4, lease: .seconds(60)))
                try await connection.simpleQuery("ROLLBACK")
                #expect(run == 0 || buffers < 100, "run \(run): claiming Apple-calling jobs touched \(buffers) buffers with 20,000 notification jobs queued")
            }
            let pool = PostgresPool(conninfo: database.url, size: 1, logger: TestDatabase.logger)
            defer { pool.close() }
            let claimed = try await JobQueue(pool: pool).claim(worker: "w", limit: 4, lease: .seconds(60))
            #expect(claimed.map(\.kind) == [.exchange] && claimed.map(\.attempt) == [1])
        }
    }
}
}
