import AppleClient
import FakeApple
import Foundation
import JobQueue
import Postgres
import Testing
import WorkerCore
import AppleJobs
import SiwaModel
import StoredTokens

/// One test per account lifecycle rule (sql/README.md, "The account lifecycle"), against the real SQL, the real
/// handlers and the fake Apple.
@Suite(.serialized) struct LifecycleRulesTests {
    static let client = LifecycleHarness.clientID

    /// The issue's transaction: a link with a fresh code and a deletion in one transaction. Whichever
    /// job a worker takes first, the account ends deleted with one revoke of the new token.
    @Test(arguments: [true, false]) func linkAndDeletionInOneTransaction(revokeClaimedFirst: Bool) async throws {
        try await withLifecycle { h in
            let code = h.fake.registerCode(clientID: Self.client, sub: "000111.h1.0001")
            let (exchange, revoke) = try await h.connection.withTransaction { connection in
                let exchange = try await connection.query(
                    "SELECT siwa.link_account(\(Self.client), '000111.h1.0001', 'user-1', \(code))")[0].decode(Int64.self, at: 0)
                let revoke = try await connection.query(
                    "SELECT siwa.request_deletion(\(Self.client), '000111.h1.0001')")[0].decode(Int64.self, at: 0)
                return (exchange, revoke)
            }
            if revokeClaimedFirst {
                guard case .snoozed = try await h.run(revoke) else {
                    Issue.record("the revoke must wait for the exchange queued before it")
                    return
                }
                #expect(try await h.status("000111.h1.0001") == "pending_deletion")
            }
            #expect(try await h.run(exchange) == .completedByHandler)
            #expect(try await h.status("000111.h1.0001") == "pending_deletion")
            #expect(try await h.run(revoke) == .completedByHandler)

            #expect(try await h.status("000111.h1.0001") == "deleted")
            #expect(try await h.storedToken("000111.h1.0001") == nil)
            let issued = h.fake.refreshTokens(clientID: Self.client, sub: "000111.h1.0001")
            #expect(issued.count == 1 && h.fake.isRevoked(refreshToken: issued[0]) == true)
            #expect(h.fake.calls.filter { $0.endpoint == "revoke" }.count == 1)
            let changes = try await h.changes("000111.h1.0001")
            #expect(changes.map(\.change) == ["deletion_requested", "deleted"])
            #expect(changes.last?.reason == "revoked")
        }
    }

    /// A pending deletion blocks a new link: 55000, "deletion pending", nothing queued. After
    /// `deleted`, a link starts a new life.
    @Test func pendingDeletionBlocksLink() async throws {
        try await withLifecycle { h in
            try await h.linkAccount(sub: "001.pend")
            let revoke = try await h.requestDeletion(sub: "001.pend")
            let jobs = try await h.scalar(Int.self, "SELECT count(*)::int FROM siwa.jobs")
            let code = h.fake.registerCode(clientID: Self.client, sub: "001.pend")
            do {
                _ = try await h.link(sub: "001.pend", code: code)
                Issue.record("link_account succeeded on a pending deletion")
            } catch let error as PostgresError {
                #expect(error.sqlState == "55000")
                #expect(error.message.contains("deletion pending"))
            }
            #expect(try await h.scalar(Int.self, "SELECT count(*)::int FROM siwa.jobs") == jobs)

            #expect(try await h.run(revoke) == .completedByHandler)
            #expect(try await h.status("001.pend") == "deleted")
            #expect(try await h.run(try await h.link(sub: "001.pend", code: code)) == .completedByHandler)
            #expect(try await h.status("001.pend") == "active")
            #expect(try await h.storedToken("001.pend") != nil)
        }
    }

    /// request_deletion with a code (an account with no stored token): the code is exchanged and the
    /// token it yields revoked, with any stored one; the `deleted` change says `revoked`.
    @Test func deletionWithCodeRevokesTheExchangedAndTheStoredToken() async throws {
        try await withLifecycle { h in
            // Linked before this system: no row at all.
            let code = h.fake.registerCode(clientID: Self.client, sub: "001.old")
            let revoke = try await h.requestDeletion(sub: "001.old", code: code)
            try await h.drain()
            #expect(try await h.status("001.old") == "deleted")
            #expect(try await h.jobRow(revoke).outcome == "deleted")
            let old = h.fake.refreshTokens(clientID: Self.client, sub: "001.old")
            #expect(old.count == 1 && old.allSatisfy { h.fake.isRevoked(refreshToken: $0) == true })
            #expect(try await h.changes("001.old").last?.reason == "revoked")
            #expect(try await h.scalar(Int.self, "SELECT count(*)::int FROM siwa.jobs WHERE args ? 'code'") == 0)

            // A stored token and a code: both revoked.
            try await h.linkAccount(sub: "001.both")
            let second = h.fake.registerCode(clientID: Self.client, sub: "001.both")
            _ = try await h.requestDeletion(sub: "001.both", code: second)
            try await h.drain()
            let both = h.fake.refreshTokens(clientID: Self.client, sub: "001.both")
            #expect(both.count == 2 && both.allSatisfy { h.fake.isRevoked(refreshToken: $0) == true })
            #expect(try await h.status("001.both") == "deleted")
            #expect(try await h.changes("001.both").last?.reason == "revoked")
        }
    }

    /// Nothing could be revoked: the `deleted` change says `no_token`.
    @Test func deletionWithoutTokenSaysNoToken() async throws {
        try await withLifecycle { h in
            _ = try await h.requestDeletion(sub: "001.none")
            try await h.drain()
            let last = try #require(try await h.changes("001.none").last)
            #expect(last.change == "deleted" && last.reason == "no_token")
        }
    }

    /// A token replaced by a relink stays valid at Apple: the deletion revokes it too.
    @Test func relinkedAccountsDeletionRevokesEveryStoredToken() async throws {
        try await withLifecycle { h in
            try await h.linkAccount(sub: "001.twice")
            try await h.linkAccount(sub: "001.twice")
            _ = try await h.requestDeletion(sub: "001.twice")
            try await h.drain()
            let tokens = h.fake.refreshTokens(clientID: Self.client, sub: "001.twice")
            #expect(tokens.count == 2 && tokens.allSatisfy { h.fake.isRevoked(refreshToken: $0) == true })
            #expect(try await h.status("001.twice") == "deleted")
        }
    }

    /// A token stored while a revoke is in flight (the revoke read the old one) is revoked before
    /// the account is deleted: the deletion is decided under the row lock, not from an earlier read.
    @Test func tokenStoredDuringTheRevokeIsRevokedToo() async throws {
        try await withLifecycle { h in
            try await h.linkAccount(sub: "001.race")
            let revoke = try await h.requestDeletion(sub: "001.race")
            let job = try await h.claim(revoke)
            let first = try await h.connection.query(
                "SELECT action, token_enc FROM siwa.revoke_step(\(job.id), \(job.attempt)::integer)")[0]
            #expect(try first.decode(String.self, column: "action") == "revoke")
            let firstToken = try first.decode([UInt8].self, column: "token_enc")
            // Meanwhile a deletion code's exchange stores a second token.
            let code = h.fake.registerCode(clientID: Self.client, sub: "001.race")
            _ = try await h.requestDeletion(sub: "001.race", code: code)
            let exchangeID = try #require(
                try await h.scalar(Int64.self, "SELECT max(id) FROM siwa.jobs WHERE kind = 'exchange' AND args ? 'code'"))
            #expect(try await h.run(exchangeID) == .completedByHandler)
            _ = try await h.connection.query("SELECT siwa.revoke_succeeded(\(job.id), \(firstToken))")
            let next = try await h.connection.query(
                "SELECT action, token_enc FROM siwa.revoke_step(\(job.id), \(job.attempt)::integer)")[0]
            #expect(try next.decode(String.self, column: "action") == "revoke")
            #expect(try next.decode([UInt8]?.self, column: "token_enc") != firstToken)
            #expect(try await h.status("001.race") == "pending_deletion")
        }
    }

    /// Apple's keys cannot be fetched when the id_token comes back: the exchange still stores the
    /// token (the id_token came straight from Apple; its claims are checked), never `link_failed`.
    @Test func keyFetchFailureDoesNotFailTheLink() async throws {
        try await withLifecycle { h in
            h.fake.injectFailures(endpoint: "keys", responses: [.status(503), .status(503), .status(503)])
            let code = h.fake.registerCode(clientID: Self.client, sub: "001.keys")
            let job = try await h.link(sub: "001.keys", code: code)
            #expect(try await h.run(job) == .completedByHandler)
            #expect(try await h.status("001.keys") == "active")
            #expect(try await h.storedToken("001.keys") != nil)
            #expect(try await h.changes("001.keys").map(\.change) == ["linked"])
        }
    }

    /// The database refuses the exchange's commit once: the commit is retried with the token held,
    /// and the link completes (before: the token was dropped, and the retry's spent code made it `link_failed`).
    @Test func databaseErrorAtTheExchangesCommitIsRetried() async throws {
        try await withLifecycle { h in
            let code = h.fake.registerCode(clientID: Self.client, sub: "001.db")
            let job = try await h.link(sub: "001.db", code: code)
            // The first write of an account fails (a sequence counts: it survives the rollback).
            _ = try await h.connection.execute("CREATE SEQUENCE public.fail_once_seq")
            _ = try await h.connection.execute(
                """
                CREATE FUNCTION public.fail_once() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    IF nextval('public.fail_once_seq') = 1 THEN
                        RAISE EXCEPTION 'injected' USING ERRCODE = '40001';
                    END IF;
                    RETURN NEW;
                END $$
                """)
            _ = try await h.connection.execute(
                """
                CREATE TRIGGER fail_once BEFORE INSERT OR UPDATE ON siwa.accounts
                    FOR EACH ROW EXECUTE FUNCTION public.fail_once()
                """)
            #expect(try await h.run(job) == .completedByHandler)
            #expect(try await h.status("001.db") == "active")
            #expect(try await h.storedToken("001.db") != nil)
            #expect(try await h.jobRow(job).outcome == "linked")
        }
    }

    /// The exchange's lease was lost while Apple answered (another run took the job): the token is
    /// stored anyway, and the job is done.
    @Test func lostLeaseDoesNotLoseTheToken() async throws {
        try await withLifecycle { h in
            let code = h.fake.registerCode(clientID: Self.client, sub: "001.lease")
            let id = try await h.link(sub: "001.lease", code: code)
            let job = try await h.claim(id)
            _ = try await h.connection.execute("UPDATE siwa.jobs SET attempt = attempt + 1 WHERE id = \(id)")  // rescued and claimed again
            #expect(await h.exchange.run(job, logger: h.logger) == .completedByHandler)
            #expect(try await h.status("001.lease") == "active")
            #expect(try await h.storedToken("001.lease") != nil)
            #expect(try await h.jobRow(id).state == "completed")
        }
    }

    /// Reconcile's invalid_grant for a token that is no longer the stored one changes nothing.
    @Test func reconcileActsOnlyOnTheTokenItTested() async throws {
        try await withLifecycle { h in
            try await h.linkAccount(sub: "001.re")
            let old = try #require(try await h.storedToken("001.re"))
            _ = try await h.connection.execute(
                "INSERT INTO siwa.jobs (kind, client_id, sub) VALUES ('reconcile', \(Self.client), '001.re')")
            let id = try #require(try await h.scalar(Int64.self, "SELECT max(id) FROM siwa.jobs WHERE kind = 'reconcile'"))
            let job = try await h.claim(id)
            try await h.linkAccount(sub: "001.re")  // a relink while the check was at Apple
            let outcome = try await h.scalar(
                String.self, "SELECT siwa.reconcile_result(\(job.id), \(job.attempt)::integer, \(old), 'invalid_grant')")
            #expect(outcome == "superseded")
            #expect(try await h.status("001.re") == "active")
            #expect(try await h.storedToken("001.re") != old)
        }
    }

    /// siwa.account for the app role: the account without its token; no row when unknown.
    @Test func accountFunctionForTheAppRole() async throws {
        try await withLifecycle { h in
            try await h.linkAccount(sub: "001.view")
            let rows = try await h.connection.withTransaction { connection in
                _ = try await connection.execute("SET LOCAL ROLE siwa_app")
                let known = try await connection.query("SELECT * FROM siwa.account(\(Self.client), '001.view')")
                let unknown = try await connection.query("SELECT * FROM siwa.account(\(Self.client), '001.nobody')")
                return (known, unknown.count)
            }
            #expect(rows.1 == 0)
            let row = try #require(rows.0.first)
            #expect(try row.decode(String.self, column: "status") == "active")
            #expect(try row.decode(Bool.self, column: "has_refresh_token") == true)
            #expect(try row.decode(String?.self, column: "app_user_id") == "user-1")
            let columns = try await h.connection.query(
                "SELECT attname FROM pg_attribute WHERE attrelid = 'siwa.account_view'::regclass AND attnum > 0 ORDER BY attnum")
                .map { try $0.decode(String.self, at: 0) }
            #expect(
                columns == [
                    "client_id", "sub", "app_user_id", "status", "email", "is_private_email", "email_forwarding",
                    "sessions_revoked_at", "linked_at", "updated_at", "has_refresh_token", "full_name", "real_user_status",
                ])
        }
    }

    /// The NOTIFY payload carries id, client_id, sub, change and status only: an 8 kB app_user_id
    /// no longer makes the account's effects fail.
    @Test func notifyPayloadIsBounded() async throws {
        try await withLifecycle { h in
            let big = String(repeating: "u", count: 8192)
            let code = h.fake.registerCode(clientID: Self.client, sub: "001.big")
            #expect(try await h.run(try await h.link(sub: "001.big", appUserID: big, code: code)) == .completedByHandler)
            _ = try await h.connection.execute(
                """
                INSERT INTO siwa.notifications (jti, client_id, sub, event_type, event_time, claims)
                VALUES ('n-big', \(Self.client), '001.big', 'consent-revoked', now() + interval '1 minute', '{}')
                """)
            #expect(try await h.scalar(String.self, "SELECT siwa.apply_notification('n-big', NULL)") == "applied")
            #expect(try await h.status("001.big") == "consent_revoked")
            let payload = try #require(
                try await h.scalar(String.self, "SELECT siwa.change_payload(1, 'c', 's', 'linked', 'active')"))
            #expect(payload == #"{"id" : 1, "client_id" : "c", "sub" : "s", "change" : "linked", "status" : "active"}"#)
        }
    }

    /// A deleted account stays deleted under Apple's notifications (our revoke's consent-revoked included).
    @Test func deletedStaysDeletedUnderNotifications() async throws {
        try await withLifecycle { h in
            try await h.linkAccount(sub: "001.gone")
            _ = try await h.requestDeletion(sub: "001.gone")
            try await h.drain()
            for (index, type) in ["consent-revoked", "account-deleted", "email-enabled", "email-disabled"].enumerated() {
                _ = try await h.connection.execute(
                    """
                    INSERT INTO siwa.notifications (jti, client_id, sub, event_type, event_time, claims)
                    VALUES (\("n-gone-\(index)"), \(Self.client), '001.gone', \(type), now() + interval '1 minute', '{}')
                    """)
                #expect(
                    try await h.scalar(String.self, "SELECT siwa.apply_notification(\("n-gone-\(index)"), NULL)")
                        == "ignored_account_deleted")
            }
            #expect(try await h.status("001.gone") == "deleted")
        }
    }

    /// A consent-revoked arriving while a deletion is pending keeps the tokens for the revoke.
    @Test func notificationDuringPendingDeletionKeepsTheTokenForTheRevoke() async throws {
        try await withLifecycle { h in
            try await h.linkAccount(sub: "001.mid")
            let token = try #require(h.fake.refreshTokens(clientID: Self.client, sub: "001.mid").first)
            _ = try await h.requestDeletion(sub: "001.mid")
            _ = try await h.connection.execute(
                """
                INSERT INTO siwa.notifications (jti, client_id, sub, event_type, event_time, claims)
                VALUES ('n-mid', \(Self.client), '001.mid', 'consent-revoked', now() + interval '1 minute', '{}')
                """)
            #expect(try await h.scalar(String.self, "SELECT siwa.apply_notification('n-mid', NULL)") == "applied")
            #expect(try await h.status("001.mid") == "pending_deletion")
            try await h.drain()
            #expect(h.fake.isRevoked(refreshToken: token) == true)
            #expect(try await h.changes("001.mid").last?.reason == "revoked")
        }
    }

    /// AccountStatus mirrors the CHECK constraint of siwa.accounts.status.
    @Test func accountStatusMirrorsTheCheckConstraint() async throws {
        let database = try await LifecycleHarness.makeDatabase()
        let connection = try await database.connect()
        let definition = try await connection.query(
            """
            SELECT pg_get_constraintdef(oid) FROM pg_constraint
             WHERE conrelid = 'siwa.accounts'::regclass AND contype = 'c' AND pg_get_constraintdef(oid) LIKE '%status%'
               AND pg_get_constraintdef(oid) NOT LIKE '%email_forwarding%' AND pg_get_constraintdef(oid) NOT LIKE '%real_user_status%'
            """)[0].decode(String.self, at: 0)
        connection.close()
        await database.drop()
        let quoted = definition.split(separator: "'").enumerated().filter { $0.offset % 2 == 1 }.map { String($0.element) }
        #expect(Set(quoted) == Set(AccountStatus.allCases.map(\.rawValue)))
        #expect(quoted.count == AccountStatus.allCases.count)
    }
}

extension LifecycleHarness {
    func requestDeletion(sub: String, code: String?) async throws -> Int64 {
        try await connection.query("SELECT siwa.request_deletion(\(Self.clientID), \(sub), \(code))")[0].decode(Int64.self, at: 0)
    }

    /// Runs due Apple jobs (exchanges first, as the claim orders them) until none is left; a snoozed
    /// job runs again on the next pass. Bounded: a job that never finishes fails the test.
    func drain(maxRuns: Int = 50) async throws {
        for _ in 0..<maxRuns {
            let next = try await connection.query(
                """
                SELECT id FROM siwa.jobs WHERE state = 'available' AND kind <> 'notification'
                 ORDER BY priority, id LIMIT 1
                """)
            guard let row = next.first else { return }
            try await run(try row.decode(Int64.self, at: 0))
        }
        throw HarnessError(message: "jobs still queued after \(maxRuns) runs")
    }
}

extension LifecycleRulesTests {
    /// A link queued after a finished deletion, then a new deletion request: the new request gets a
    /// new job, which waits for that link's exchange and revokes its token (i10m finding D7).
    @Test func deletionAfterALinkQueuedOnADeletedAccount() async throws {
        try await withLifecycle { h in
            let first = try await h.requestDeletion(sub: "001.again")
            try await h.drain()
            let code = h.fake.registerCode(clientID: Self.client, sub: "001.again")
            _ = try await h.link(sub: "001.again", code: code)
            let second = try await h.requestDeletion(sub: "001.again")
            #expect(second != first)
            try await h.drain()
            #expect(try await h.status("001.again") == "deleted")
            let tokens = h.fake.refreshTokens(clientID: Self.client, sub: "001.again")
            #expect(tokens.count == 1 && h.fake.isRevoked(refreshToken: tokens[0]) == true)
            #expect(try await h.changes("001.again").last?.reason == "revoked")
        }
    }
}

/// App groups (sql/README.md, "The account lifecycle": **App groups**).
@Suite(.serialized) struct AppGroupTests {
    /// A web sign-in linked under the Services ID; Apple's consent-revoked names the App ID: every
    /// account of the group with that sub gets the effect and its own change row, no phantom row is
    /// created, and another group's account with the same sub is untouched.
    @Test func notificationForTheAppIDReachesTheServicesIDAccount() async throws {
        try await withLifecycle { h in
            try await AppGroups.store(
                [["com.example.app", "com.example.web"], ["com.other.app", "com.other.web"]], on: h.pool)
            for client in ["com.example.web", "com.example.app", "com.other.web"] where client != "com.example.app" {
                _ = try await h.connection.execute(
                    """
                    INSERT INTO siwa.accounts (client_id, sub, status, linked_at, refresh_token_enc)
                    VALUES (\(client), '001.web', 'active', now() - interval '1 day', '\\x01')
                    """)
            }
            _ = try await h.connection.execute(
                """
                INSERT INTO siwa.notifications (jti, client_id, sub, event_type, event_time, claims)
                VALUES ('n-group', 'com.example.app', '001.web', 'consent-revoked', now(), '{}')
                """)
            #expect(try await h.scalar(String.self, "SELECT siwa.apply_notification('n-group', NULL)") == "applied")
            let rows = try await h.connection.query(
                "SELECT client_id, status, refresh_token_enc IS NULL AS dropped FROM siwa.accounts WHERE sub = '001.web' ORDER BY client_id"
            ).map {
                "\(try $0.decode(String.self, column: "client_id"))=\(try $0.decode(String.self, column: "status"))/\(try $0.decode(Bool.self, column: "dropped"))"
            }
            #expect(rows == ["com.example.web=consent_revoked/true", "com.other.web=active/false"])
            let changes = try await h.connection.query(
                "SELECT client_id || ':' || change FROM siwa.account_changes WHERE sub = '001.web' ORDER BY id"
            ).map { try $0.decode(String.self, at: 0) }
            #expect(changes == ["com.example.web:consent_revoked"])

            // With an account under both IDs, both get it (each its own row); ungrouped IDs as before.
            _ = try await h.connection.execute(
                """
                INSERT INTO siwa.accounts (client_id, sub, status, linked_at)
                VALUES ('com.example.app', '001.both', 'active', now() - interval '1 day'),
                       ('com.example.web', '001.both', 'active', now() - interval '1 day');
                """)
            _ = try await h.connection.execute(
                """
                INSERT INTO siwa.notifications (jti, client_id, sub, event_type, event_time, email, claims)
                VALUES ('n-both', 'com.example.web', '001.both', 'email-disabled', now(), 'b@privaterelay.appleid.com', '{}'),
                       ('n-solo', 'com.solo.app', '001.both', 'email-disabled', now(), 'b@privaterelay.appleid.com', '{}')
                """)
            _ = try await h.connection.query("SELECT siwa.apply_notifications(ARRAY['n-both', 'n-solo'], ARRAY[NULL, NULL]::bigint[])")
            let forwarding = try await h.connection.query(
                "SELECT client_id || '=' || email_forwarding FROM siwa.accounts WHERE sub = '001.both' ORDER BY client_id"
            ).map { try $0.decode(String.self, at: 0) }
            #expect(forwarding == ["com.example.app=disabled", "com.example.web=disabled", "com.solo.app=disabled"])
            #expect(try await h.scalar(Int.self, "SELECT count(*)::int FROM siwa.account_changes WHERE sub = '001.both'") == 3)
        }
    }
}

/// Retention gaps once found: the change feed, discarded exchanges' codes, discarded
/// notifications' personal data.
@Suite(.serialized) struct LifecycleRetentionTests {
    @Test func changeFeedIsPrunedByAge() async throws {
        try await withLifecycle { h in
            _ = try await h.connection.execute(
                """
                INSERT INTO siwa.account_changes (client_id, sub, change, created_at)
                VALUES ('c', 'old', 'linked', now() - interval '31 days'), ('c', 'new', 'linked', now() - interval '29 days')
                """)
            #expect(try await h.connection.query(Retention.pruneAccountChangesQuery(olderThan: .seconds(30 * 86_400)))[0].decode(Int.self, at: 0) == 1)
            #expect(try await h.scalar(String.self, "SELECT string_agg(sub, ',') FROM siwa.account_changes") == "new")
        }
    }

    @Test func discardedOrCancelledExchangeKeepsNoCode() async throws {
        try await withLifecycle { h in
            let queue = JobQueue(pool: h.pool)
            let first = try await h.link(sub: "001.disc", code: "c0de-1")
            let job = try await h.claim(first)
            #expect(try await queue.fail(job, error: "database_error", retryAfter: nil, discard: true, policy: RetryPolicy()) == .discarded)
            #expect(try await h.jobRow(first).state == "discarded")
            #expect(try await !h.jobRow(first).args.contains("code"))

            let second = try await h.link(sub: "001.canc", code: "c0de-2")
            let result = try await JobAdministration(connection: h.connection).cancel(.id(second), force: false)
            #expect(result.cancelled == [second])
            #expect(try await !h.jobRow(second).args.contains("code"))
        }
    }

    /// Processed notifications older than the retention go with their completed or cancelled jobs;
    /// a discarded job stays (an operator may retry it), and so do a recent and an unprocessed one.
    @Test func processedNotificationsArePrunedWithTheirFinishedJobs() async throws {
        try await withLifecycle { h in
            for (jti, processed, state) in [("p-done", "31 days", "completed"), ("p-cancelled", "31 days", "cancelled"),
                                            ("p-discarded", "31 days", "discarded"), ("p-recent", "1 day", "completed"),
                                            ("p-unprocessed", "", "available")] {
                _ = try await h.connection.execute(
                    """
                    INSERT INTO siwa.notifications (jti, client_id, sub, event_type, event_time, claims, jws, processed_at)
                    VALUES (\(jti), \(LifecycleHarness.clientID), '001.p', 'email-enabled', now(), '{}', 'h.p.s',
                            now() - nullif(\(processed), '')::interval)
                    """)
                _ = try await h.connection.execute(
                    "UPDATE siwa.jobs SET state = \(state), run_at = now() WHERE notification_jti = \(jti)")
            }
            #expect(try await h.connection.query(Retention.pruneNotificationsQuery(olderThan: .seconds(30 * 86_400)))[0].decode(Int.self, at: 0) == 3)
            #expect(try await h.scalar(String.self, "SELECT string_agg(jti, ',' ORDER BY jti) FROM siwa.notifications")
                == "p-recent,p-unprocessed")
            #expect(try await h.scalar(String.self, "SELECT string_agg(notification_jti, ',' ORDER BY notification_jti) FROM siwa.jobs WHERE kind = 'notification'")
                == "p-discarded,p-recent,p-unprocessed")
        }
    }

    @Test func discardedNotificationLosesItsPersonalDataAfterRetention() async throws {
        try await withLifecycle { h in
            for (jti, age) in [("n-old", "31 days"), ("n-recent", "1 day")] {
                _ = try await h.connection.execute(
                    """
                    INSERT INTO siwa.notifications (jti, client_id, sub, event_type, event_time, email, claims, jws)
                    VALUES (\(jti), \(LifecycleHarness.clientID), '001.n', 'email-enabled', now(), 'n@x.example',
                            '{"events":"{}"}', 'h.p.s')
                    """)
                _ = try await h.connection.execute(
                    """
                    UPDATE siwa.jobs SET state = 'discarded', finalized_at = now() - \(age)::interval
                     WHERE notification_jti = \(jti)
                    """)
            }
            #expect(
                try await h.connection.query(Retention.scrubDiscardedNotificationsQuery(olderThan: .seconds(30 * 86_400)))[0].decode(Int.self, at: 0) == 1)
            #expect(try await h.scalar(String.self, "SELECT jti FROM siwa.notifications WHERE jws IS NULL AND email IS NULL") == "n-old")
            #expect(try await h.scalar(Int.self, "SELECT count(*)::int FROM siwa.notifications WHERE jws IS NOT NULL") == 1)
        }
    }
}

extension LifecycleRulesTests {
    /// Key rotation re-seals the tokens kept for a later deletion too; the deletion, with only the
    /// new key configured, still revokes both tokens.
    @Test func keyRotationReachesRetiredTokens() async throws {
        try await withLifecycle { h in
            try await h.linkAccount(sub: "001.rot")
            try await h.linkAccount(sub: "001.rot")  // the first token is retired, still valid at Apple
            let newKey = TestSecrets.tokenKeys(["k2"])
            let rotated = try TokenBox(configuration: newKey + "," + h.tokenKeys)
            let rotation = TokenKeyRotation(connection: h.connection, tokenBox: rotated)
            #expect(try await rotation.remaining() == 2)
            #expect(try await rotation.run().reencrypted == 2)
            #expect(try await rotation.remaining() == 0)
            let retired = try #require(
                try await h.scalar([UInt8].self, "SELECT retired_tokens_enc[1] FROM siwa.accounts WHERE sub = '001.rot'"))
            #expect(TokenBox.keyID(of: retired) == "k2")
            let onlyNew = try TokenBox(configuration: newKey)
            let tokens = h.fake.refreshTokens(clientID: Self.client, sub: "001.rot")
            #expect(try tokens.contains(onlyNew.open(retired, clientID: Self.client, sub: "001.rot")))
        }
    }

    /// An import for an account pending deletion keeps the token for the revoke (it is a live grant).
    @Test func importDuringPendingDeletionIsRevoked() async throws {
        try await withLifecycle { h in
            try await h.linkAccount(sub: "001.imp")
            let revoke = try await h.requestDeletion(sub: "001.imp")
            h.fake.registerRefreshToken("rtok-imported", clientID: Self.client, sub: "001.imp")
            let summary = try await AccountImporter(connection: h.connection, tokenBox: h.tokenBox)
                .run(lines: ["\(Self.client),001.imp,user-i,rtok-imported"])
            #expect(summary.imported == 0 && summary.skipped == 1)
            #expect(try await h.run(revoke) == .completedByHandler)
            #expect(try await h.status("001.imp") == "deleted")
            #expect(h.fake.isRevoked(refreshToken: "rtok-imported") == true)
        }
    }

    /// Found by the lifecycle model: the user's grant ended (so the old store's token is dead), the
    /// user linked again, then the old store was imported. The linked token stays current; the
    /// imported one is only held for a deletion. Made current, the dead token failed the next
    /// reconciliation and the live account was taken for consent withdrawn, its live token dropped.
    @Test func importOntoALinkedAccountKeepsTheNewerToken() async throws {
        try await withLifecycle { h in
            h.fake.registerRefreshToken("rtok-old-store", clientID: Self.client, sub: "001.imp-linked", issuedAt: Date(timeIntervalSinceNow: -3600))
            h.fake.userEndedGrants(clientID: Self.client, sub: "001.imp-linked", issuedBefore: Date())
            try await h.linkAccount(sub: "001.imp-linked")
            let linked = try #require(try await h.storedToken("001.imp-linked"))
            let summary = try await AccountImporter(connection: h.connection, tokenBox: h.tokenBox)
                .run(lines: ["\(Self.client),001.imp-linked,user-i,rtok-old-store"])
            #expect(summary.imported == 1)
            #expect(try await h.storedToken("001.imp-linked") == linked, "the newer token stays current")
            #expect(try await h.heldTokenCount("001.imp-linked") == 2, "the imported one is held for a deletion")

            _ = try await h.connection.execute("UPDATE siwa.accounts SET token_checked_at = now() - interval '25 hours'")
            #expect(try await ReconcileScheduler(pool: h.pool, logger: h.logger, batchSize: 10).queueBatch() == 1)
            let check = try #require(try await h.scalar(Int64.self, "SELECT max(id) FROM siwa.jobs WHERE kind = 'reconcile'"))
            #expect(try await h.run(check) == .completedByHandler)
            #expect(try await h.jobRow(check).outcome == "token_valid")
            #expect(try await h.status("001.imp-linked") == "active")
        }
    }

    /// A token imported after the deletion finished (a legacy store exported before it) was never
    /// seen by that deletion: it is revoked by a job of its own, and the account stays deleted.
    @Test func importAfterTheDeletionFinishedIsRevoked() async throws {
        try await withLifecycle { h in
            try await h.linkAccount(sub: "001.imp-late")
            let deletion = try await h.requestDeletion(sub: "001.imp-late")
            #expect(try await h.run(deletion) == .completedByHandler)
            #expect(try await h.status("001.imp-late") == "deleted")
            h.fake.registerRefreshToken("rtok-imported-late", clientID: Self.client, sub: "001.imp-late")
            let summary = try await AccountImporter(connection: h.connection, tokenBox: h.tokenBox)
                .run(lines: ["\(Self.client),001.imp-late,user-i,rtok-imported-late"])
            #expect(summary.imported == 0 && summary.skipped == 1)
            let late = try #require(
                try await h.scalar(
                    Int64.self, "SELECT max(id) FROM siwa.jobs WHERE kind = 'revoke' AND sub = '001.imp-late' AND id > \(deletion)"))
            #expect(try await h.run(late) == .completedByHandler)
            #expect(h.fake.isRevoked(refreshToken: "rtok-imported-late") == true)
            #expect(try await h.status("001.imp-late") == "deleted")
            #expect(try await h.storedToken("001.imp-late") == nil)
        }
    }
}
