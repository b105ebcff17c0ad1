import Foundation
import JobQueue
import Postgres
import TestTiming
import Testing

/// Hot accounts: many events of one account in one notification batch. The fast path applies an
/// account's email events in one set-based round (siwa.apply_notifications); the isolated path
/// (one subtransaction per job, each applied alone) applies them one by one, in event_time order.
/// Both must end the same, in every account state the events can meet.
@Suite("Hot accounts in one notification batch")
struct HotAccountBatchTests {
    /// The account states, by sub: no row yet; linked after some events; with a newer email event
    /// already applied (equal times included); consent revoked; a pending deletion (its email events
    /// are ignored, and it is left to the rounds).
    static let starts = ["new", "linked", "emailed", "revoked", "pending"]

    /// (seconds after the base time, type, email, is_private_email), in the order they are queued.
    static let events: [(Int, String, String?, Bool?)] = [
        (12, "email-enabled", "a@privaterelay.appleid.com", true), (3, "email-disabled", "b@example.com", false),
        (10, "email-enabled", nil, nil), (10, "email-disabled", "c@privaterelay.appleid.com", true),
        (7, "email-enabled", "d@example.com", nil), (12, "email-enabled", "e@privaterelay.appleid.com", true),
        (15, "email-disabled", nil, nil), (4, "email-enabled", "f@example.com", false),
        (15, "email-enabled", "g@privaterelay.appleid.com", nil), (15, "email-enabled", nil, false),
    ]

    @Test func aHotAccountsEmailEventsInOneRoundEndAsOneByOne() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            let listener = try await database.connect()
            defer { listener.close() }
            try await listener.listen("siwa_account_changes")
            let pool = PostgresPool(conninfo: database.url, size: 1, logger: TestDatabase.logger)
            defer { pool.close() }
            let base = "timestamptz '2026-01-01 00:00:00+00'"
            for path in ["fast", "slow"] {
                for start in Self.starts {
                    let sub = "\(start)-\(path)"
                    let row: String? =
                        switch start {
                        case "linked": "'active', NULL, NULL, \(base) + interval '5 s'"
                        case "emailed": "'active', \(base) + interval '10 s', 'enabled', \(base) + interval '1 s'"
                        case "revoked": "'consent_revoked', \(base) + interval '3 s', 'disabled', \(base) + interval '1 s'"
                        case "pending": "'pending_deletion', NULL, NULL, \(base) + interval '1 s'"
                        default: nil
                        }
                    if let row {
                        try await connection.execute(
                            """
                            INSERT INTO siwa.accounts (client_id, sub, app_user_id, status, last_email_event_at, email_forwarding,
                                                       linked_at, email, is_private_email)
                            VALUES ('com.example.app', \(sub), 'user-' || \(sub), \(unsafeSQL: row), 'old@example.com', false)
                            """)
                    }
                    for (index, event) in Self.events.enumerated() {
                        let (seconds, type, email, isPrivate) = event
                        try await connection.execute(
                            """
                            INSERT INTO siwa.notifications (jti, client_id, sub, event_type, event_time, email, is_private_email, claims, jws)
                            VALUES (\(sub) || '-' || \(index), 'com.example.app', \(sub), \(type),
                                    \(unsafeSQL: base) + make_interval(secs => \(Double(seconds))), \(email), \(isPrivate),
                                    '{}', 'header.payload.signature')
                            """)
                    }
                }
            }
            // Each path's batch takes only its own jobs (the others parked, as held ones would be).
            func batch(_ path: String, isolate: Bool) async throws -> (results: [JobQueue.NotificationResult], accountUpdates: Int) {
                try await connection.execute(
                    """
                    UPDATE siwa.jobs SET run_at = CASE WHEN sub LIKE '%-' || \(path) THEN now() ELSE 'infinity' END
                     WHERE state = 'available'
                    """)
                return try await pool.withConnection { connection in
                    try await connection.withTransaction { connection in
                        let results = try await JobQueue.runNotificationBatch(
                            on: connection, worker: "w", limit: 500, lease: .seconds(60),
                            policy: RetryPolicy(base: .seconds(1), cap: .seconds(1)), isolate: isolate)
                        let updates = try await connection.int(
                            "SELECT n_tup_upd::int FROM pg_stat_xact_user_tables WHERE relid = 'siwa.accounts'::regclass")
                        return (results, updates)
                    }
                }
            }
            let fast = try await batch("fast", isolate: false)
            let slow = try await batch("slow", isolate: true)
            #expect(fast.results.count == Self.starts.count * Self.events.count)
            #expect(fast.results.allSatisfy { $0.state == "completed" })
            #expect(slow.results.allSatisfy { $0.state == "completed" })
            // One write per account that applied anything (pending_deletion applies nothing), not
            // one per applied event: the events took one round.
            #expect(fast.accountUpdates == 4, "account rows written \(fast.accountUpdates) times")

            func outcomes(_ path: String) async throws -> [String] {
                try await connection.query(
                    """
                    SELECT split_part(sub, '-', 1) || ' ' || split_part(jti, '-', 3) || ' ' || outcome
                      FROM siwa.notifications WHERE sub LIKE '%-' || \(path)
                     ORDER BY split_part(sub, '-', 1), split_part(jti, '-', 3)::int
                    """
                ).map { try $0.decode(String.self, at: 0) }
            }
            func accounts(_ path: String) async throws -> [String] {
                try await connection.query(
                    """
                    SELECT concat_ws(' ', split_part(sub, '-', 1), status, email_forwarding, email, is_private_email,
                                     last_email_event_at, app_user_id, updated_at IS NOT NULL)
                      FROM siwa.accounts WHERE sub LIKE '%-' || \(path) ORDER BY sub
                    """
                ).map { try $0.decode(String.self, at: 0).replacingOccurrences(of: "-\(path)", with: "") }
            }
            func changes(_ path: String) async throws -> [String] {
                try await connection.query(
                    """
                    SELECT concat_ws(' ', split_part(sub, '-', 1), split_part(notification_jti, '-', 3), change, status,
                                     replace(app_user_id, '-' || \(path), ''))
                      FROM siwa.account_changes WHERE sub LIKE '%-' || \(path) ORDER BY sub, id
                    """
                ).map { try $0.decode(String.self, at: 0) }
            }
            let fastOutcomes = try await outcomes("fast")
            #expect(fastOutcomes == (try await outcomes("slow")))
            #expect(try await accounts("fast") == (try await accounts("slow")))
            let fastChanges = try await changes("fast")
            #expect(fastChanges == (try await changes("slow")))
            // The states were met: something applied, something stale, something unchanged, something ignored.
            for outcome in ["applied", "stale", "no_change", "ignored_account_deleted"] {
                #expect(fastOutcomes.contains { $0.hasSuffix(" \(outcome)") }, "no \(outcome) in \(fastOutcomes)")
            }
            // One NOTIFY per change row, on either path.
            var told: [String: Int] = [:]
            try? await waitUntil("every change row was told", timeout: .seconds(10), every: .zero) {
                for notification in try await listener.waitForNotifications(timeout: .milliseconds(200)) {
                    told[notification.payload.contains("-fast\"") ? "fast" : "slow", default: 0] += 1
                }
                return told.values.reduce(0, +) >= fastChanges.count * 2
            }
            #expect(told == ["fast": fastChanges.count, "slow": fastChanges.count])
        }
    }

    /// Ending events discard every token of their accounts, each queued for a revoke of its own.
    /// The fast path queues a round's revokes in one INSERT (siwa.revoke_tokens_later); they must
    /// come out as the isolated path's call per token leaves them: batch order (not the accounts'
    /// key order), each account's current token before its retired ones, in their order.
    @Test func aRoundsRevokesAreQueuedInTheOrderOneByOneQueuesThem() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            let pool = PostgresPool(conninfo: database.url, size: 1, logger: TestDatabase.logger)
            defer { pool.close() }
            // (sub, event, current token, retired tokens), in event_time order.
            let accounts = [
                ("carol", "consent-revoked", "c1", ["c2", "c3"]), ("alice", "account-deleted", "a1", ["a2"]),
                ("bob", "consent-revoked", "b1", []),
            ]
            for path in ["fast", "slow"] {
                for (index, (name, event, token, retired)) in accounts.enumerated() {
                    let sub = "\(name)-\(path)"
                    try await connection.execute(
                        """
                        INSERT INTO siwa.accounts (client_id, sub, app_user_id, status, refresh_token_enc, retired_tokens_enc, linked_at)
                        VALUES ('com.example.app', \(sub), 'user-' || \(sub), 'active', decode(\(token), 'hex'),
                                ARRAY(SELECT decode(t, 'hex') FROM unnest(\(retired)::text[]) AS t), timestamptz '2026-01-01')
                        """)
                    try await connection.execute(
                        """
                        INSERT INTO siwa.notifications (jti, client_id, sub, event_type, event_time, claims, jws)
                        VALUES (\(sub), 'com.example.app', \(sub), \(event),
                                timestamptz '2026-01-02' + make_interval(secs => \(Double(index))), '{}', 'header.payload.signature')
                        """)
                }
            }
            for (path, isolate) in [("fast", false), ("slow", true)] {
                try await connection.execute(
                    """
                    UPDATE siwa.jobs SET run_at = CASE WHEN sub LIKE '%-' || \(path) THEN now() ELSE 'infinity' END
                     WHERE state = 'available' AND kind = 'notification'
                    """)
                let results = try await pool.withConnection { connection in
                    try await connection.withTransaction { connection in
                        try await JobQueue.runNotificationBatch(
                            on: connection, worker: "w", limit: 50, lease: .seconds(60),
                            policy: RetryPolicy(base: .seconds(1), cap: .seconds(1)), isolate: isolate)
                    }
                }
                #expect(results.count == accounts.count && results.allSatisfy { $0.outcome == "applied" }, "\(path): \(results)")
            }
            func revokes(_ path: String) async throws -> [String] {
                try await connection.query(
                    """
                    SELECT concat_ws(' ', split_part(sub, '-', 1), encode(decode(args->>'token_enc', 'base64'), 'hex'), args->>'reason')
                      FROM siwa.jobs WHERE kind = 'revoke' AND sub LIKE '%-' || \(path) ORDER BY id
                    """
                ).map { try $0.decode(String.self, at: 0) }
            }
            let expected = accounts.flatMap { name, _, token, retired in ([token] + retired).map { "\(name) \($0) grant_ended" } }
            #expect(try await revokes("fast") == expected)
            #expect(try await revokes("slow") == expected)
        }
    }

    /// A loop whose batch left a job queued because another transaction held its account tries
    /// again soon, not at the next poll: nothing tells it when that transaction (an app's, or another
    /// worker process's batch) ends. With the poll at an hour, the job is applied once the account
    /// is free (it waited for the hour).
    /// Two batches over the same hot users at once. Skipping busy users, the second reads none of
    /// the first one's users' jobs (it would only have deferred them once their accounts turned out
    /// busy) and takes the other users' jobs; without skipping it reads them. Once the first
    /// commits, its users are free again.
    @Test func aBatchSkippingBusyUsersLeavesTheirJobsToTheBatchTakingThem() async throws {
        try await withTwoSessions { database, first, second in
            // Held jobs, alternating between alice and bob, then carol's two.
            for (prefix, sub) in [("a", "alice"), ("b", "bob"), ("a2", "alice"), ("b2", "bob"), ("a3", "alice"), ("b3", "bob")] {
                try await database.queueNotifications(1, prefix: prefix, sub: sub, on: first)
            }
            try await database.queueNotifications(2, prefix: "c", sub: "carol", on: first)
            try await first.execute("UPDATE siwa.jobs SET run_at = 'infinity'")
            func subs(_ rows: PostgresRows) throws -> [String] { try rows.map { try $0.decode(String.self, column: "sub") } }

            try await first.simpleQuery("BEGIN")
            let taken = try await first.query(JobQueue.heldNotificationsQuery(limit: 2, skipBusyAccounts: true))
            #expect(try subs(taken) == ["alice", "bob"])
            for skipping in [false, true] {
                try await second.simpleQuery("BEGIN")
                let rows = try await second.query(JobQueue.heldNotificationsQuery(limit: 10, skipBusyAccounts: skipping))
                try await second.simpleQuery("ROLLBACK")
                #expect(
                    try subs(rows) == (skipping ? ["carol", "carol"] : ["alice", "bob", "alice", "bob", "carol", "carol"]),
                    "skipping busy users: \(skipping)")
            }
            try await first.simpleQuery("COMMIT")
            try await second.simpleQuery("BEGIN")
            let after = try await second.query(JobQueue.heldNotificationsQuery(limit: 10, skipBusyAccounts: true))
            try await second.simpleQuery("ROLLBACK")
            #expect(try subs(after) == ["alice", "bob", "alice", "bob", "alice", "bob", "carol", "carol"])
        }
    }

    /// The same for due jobs (a held job deferred once is released as one): a batch skipping busy
    /// users claims none of a user another batch is taking, and the other users' jobs; without
    /// skipping it claims them too. Before, due jobs were claimed without the lock, so a hot user's
    /// released jobs met the batch that held the user again and were deferred again.
    @Test func aBatchSkippingBusyUsersClaimsNoneOfTheirDueJobs() async throws {
        try await withTwoSessions { database, first, second in
            try await database.queueNotifications(1, prefix: "h", sub: "alice", on: first)
            try await first.execute("UPDATE siwa.jobs SET run_at = 'infinity'")
            // Due: two of alice's (released after a deferral) and one of carol's.
            try await database.queueNotifications(2, prefix: "a", sub: "alice", on: first)
            try await database.queueNotifications(1, prefix: "c", sub: "carol", on: first)
            let policy = RetryPolicy(base: .seconds(1), cap: .seconds(1))

            try await first.simpleQuery("BEGIN")
            let taken = try await first.query(JobQueue.heldNotificationsQuery(limit: 1, skipBusyAccounts: true))
            #expect(try taken.map { try $0.decode(String.self, column: "sub") } == ["alice"])
            for skipping in [false, true] {
                try await second.simpleQuery("BEGIN")
                let results = try await JobQueue.runNotificationBatch(
                    on: second, worker: "w", limit: 10, lease: .seconds(60), policy: policy, isolate: false,
                    skipBusyAccounts: skipping)
                try await second.simpleQuery("ROLLBACK")
                #expect(
                    results.compactMap(\.jti).sorted() == (skipping ? ["c1"] : ["a1", "a2", "c1"]),
                    "skipping busy users: \(skipping)")
            }
            try await first.simpleQuery("ROLLBACK")
            try await second.simpleQuery("BEGIN")
            let after = try await JobQueue.runNotificationBatch(
                on: second, worker: "w", limit: 10, lease: .seconds(60), policy: policy, isolate: false, skipBusyAccounts: true)
            try await second.simpleQuery("ROLLBACK")
            #expect(after.compactMap(\.jti).sorted() == ["a1", "a2", "c1"])
        }
    }

    @Test func aDeferredJobIsTriedAgainWithoutWaitingForThePoll() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            let blocker = try await database.holdAccount("held", on: connection)
            defer { blocker.close() }
            _ = try await database.queueNotifications(1, prefix: "held", sub: "held", on: connection)
            let worker = try database.startWorker(["SIWA_NOTIFICATION_CONNECTIONS": "1", "SIWA_POLL_INTERVAL": "1h"])
            let port = try await worker.boundHTTPPort()
            // Deferred at least once (the account is held), then the holder ends without a NOTIFY.
            try await waitUntil("the worker deferred the held account at least once") { try await Self.deferredAtLeastOnce(port: port) }
            try await blocker.simpleQuery("ROLLBACK")
            try await connection.waitFor(
                "SELECT count(*) FROM siwa.notifications WHERE processed_at IS NOT NULL", timeout: .seconds(30)) { $0 == 1 }
            await worker.stop()
        }
    }

    static func deferredAtLeastOnce(port: Int) async throws -> Bool {
        let metrics = try await HTTP.request("GET", "http://127.0.0.1:\(port)/metrics").body
        return metrics.split(separator: "\n").contains {
            $0.hasPrefix("siwa_worker_notifications_deferred_total ") && !$0.hasSuffix(" 0")
        }
    }
}

/// A migrated database and two sessions on it, for tests of what one batch's locks do to another.
private func withTwoSessions(
    _ body: (MigratedDatabase, PostgresConnection, PostgresConnection) async throws -> Void
) async throws {
    try await withMigratedDatabase { database in
        let first = try await database.connect()
        let second = try await database.connect()
        defer {
            first.close()
            second.close()
        }
        try await body(database, first, second)
    }
}
