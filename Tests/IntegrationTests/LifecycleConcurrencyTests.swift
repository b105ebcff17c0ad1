import Foundation
import JobQueue
import Postgres
import TestTiming
import Testing

/// Two lifecycle operations on one account in transactions open at the same time (the lifecycle
/// model runs each step alone; here the second starts while the first holds its locks), with the
/// commits in either order. Whatever the schedule, the account must end as if the two had run one
/// after the other, in one order or the other: the same status, tokens, queued jobs and change
/// rows, the same refusals, and no deadlock.
///
/// `SIWA_CONCURRENCY_TRIALS` (default 300), `SIWA_CONCURRENCY_SEED` (default random, printed).
@Suite struct LifecycleConcurrencyTests {
    static let clientID = "com.example.app"

    enum Operation: String, CaseIterable, CustomStringConvertible {
        case link = "app: link_account"
        case requestDeletion = "app: request_deletion"
        case requestDeletionWithCode = "app: request_deletion with a code"
        case applyNotification = "worker: notification batch (oldest pending)"
        case exchangeSucceeded = "worker: exchange answered 200"
        case exchangeFailed = "worker: exchange answered invalid_grant"
        case revoke = "worker: revoke steps until done, Apple answering 200"
        case signIn = "app API: sign-in with a code (reads the account, then the exchange's token)"
        case importToken = "operator: siwa accounts import"
        case reconcileValid = "worker: reconcile, Apple says the token is valid"
        case reconcileInvalid = "worker: reconcile, Apple answers invalid_grant"
        var description: String { rawValue }

        /// Reads the account in a transaction of its own, then (after a call to Apple) writes in
        /// another: the other operation may commit between the two.
        var readsFirst: Bool { [.signIn, .reconcileValid, .reconcileInvalid].contains(self) }
    }

    /// What a read-first operation read.
    enum Reading {
        case signIn(pendingDeletion: Bool, deletionRequestsSeen: Int64)
        case reconcile(storedToken: [UInt8]?)
    }

    struct Start: CustomStringConvertible {
        /// nil: no account row.
        var status: String?
        var linkQueued: Bool
        var deletionRequested: Bool
        var reconcileQueued: Bool
        /// Notifications stored and pending: their types, in event-time order (all newer than the link).
        var notifications: [String]
        var description: String {
            "\(status ?? "no account")" + (linkQueued ? ", link queued" : "") + (deletionRequested ? ", deletion requested" : "")
                + (reconcileQueued ? ", reconcile queued" : "")
                + (notifications.isEmpty ? "" : ", pending \(notifications)")
        }
    }

    struct Trial: CustomStringConvertible {
        var start: Start
        var first: Operation
        var second: Operation
        /// When the second did not wait for the first's locks: whether it commits first.
        var secondCommitsFirst: Bool
        var description: String {
            "from \(start): [\(first)] ‖ [\(second)]" + (secondCommitsFirst ? ", the second commits first if it can" : "")
        }
    }

    static func trial(seed: UInt64) -> Trial {
        var random = SeededGenerator(seed: seed)
        let types = ["email-enabled", "email-disabled", "consent-revoked", "account-deleted"]
        let start = Start(
            status: [nil, "active", "deleted", "consent_revoked"].randomElement(using: &random)!,
            linkQueued: Bool.random(using: &random), deletionRequested: Int.random(in: 0..<3, using: &random) == 0,
            reconcileQueued: Bool.random(using: &random),
            notifications: (0..<Int.random(in: 0...2, using: &random)).map { _ in types.randomElement(using: &random)! })
        return Trial(
            start: start, first: Operation.allCases.randomElement(using: &random)!,
            second: Operation.allCases.randomElement(using: &random)!, secondCommitsFirst: Bool.random(using: &random))
    }

    /// Trials that once failed, run first every time:
    /// - a link's failed exchange recorded `link_failed` without the account's lock, reading a stale
    ///   status, while a deletion requested meanwhile took a later id and committed first;
    /// - the same for a sub with no account row yet (the deletion creates it): nothing to lock;
    /// - an import onto a deleted account queued a late token's revoke, which a link queued before
    ///   it took for a deletion requested after it: the new life's token was kept for a deletion.
    static let regressions: [UInt64] = [0xaf74_22a7_cfe2_de15, 0xb050_8980_fc85_2a7a, 0xb21a_87b9_6db8_4802]

    @Test func concurrentOperationsEndAsOneAfterTheOther() async throws {
        let settings = SearchSettings(prefix: "SIWA_CONCURRENCY", countName: "TRIALS", defaultCount: 300)
        let (count, seed) = (settings.count, settings.seed)
        print("lifecycle concurrency: \(count) trials, seed \(settings.seedText)")
        let database = try await MigratedDatabase.make()
        let first = try await database.connect()
        let second = try await database.connect()
        let observer = try await database.connect()
        try await withTeardown { teardown in
            teardown.add {
                for connection in [first, second, observer] { connection.close() }
                await database.drop()
            }
            let secondPID = try await second.query("SELECT pg_backend_pid()")[0].decode(Int32.self, at: 0)
            var master = SeededGenerator(seed: seed)
            var runs = 0
            var (blockedRuns, refusedRuns, orderMattered) = (0, 0, 0)
            for index in 0..<(Self.regressions.count + count) {
                let trialSeed = index < Self.regressions.count ? Self.regressions[index] : master.next()
                let trial = Self.trial(seed: trialSeed)
                runs += 1
                var serial = [
                    try await Self.runSerially(trial, secondFirst: false, sub: "s\(runs)-ab", on: observer),
                    try await Self.runSerially(trial, secondFirst: true, sub: "s\(runs)-ba", on: observer),
                ]
                // A read-first operation may also have read before the other and written after it.
                if trial.first.readsFirst {
                    serial.append(try await Self.runSplit(trial, splitSecond: false, sub: "s\(runs)-a-b-a", on: observer))
                }
                if trial.second.readsFirst {
                    serial.append(try await Self.runSplit(trial, splitSecond: true, sub: "s\(runs)-b-a-b", on: observer))
                }
                let concurrent = try await Self.runConcurrently(
                    trial, sub: "s\(runs)-c", first: first, second: second, secondPID: secondPID, observer: observer)
                if concurrent.blocked { blockedRuns += 1 }
                if concurrent.refusals.contains(where: { !$0.hasSuffix(": ok") }) { refusedRuns += 1 }
                if serial[0] != serial[1] { orderMattered += 1 }
                #expect(serial.contains(concurrent), """
                    trial 0x\(String(trialSeed, radix: 16)) \(trial)
                    concurrent:
                    \(concurrent)
                    first then second:
                    \(serial[0])
                    second then first:
                    \(serial[1])
                    \(serial.count > 2 ? "with the other between a read and its write:\n\(serial[2...].map(\.description).joined(separator: "\n"))" : "")
                    """)
                if !serial.contains(concurrent) { break }
            }
            print("lifecycle concurrency: \(runs) trials; the second waited for the first's locks in \(blockedRuns), "
                + "an operation was refused in \(refusedRuns), the two serial orders ended differently in \(orderMattered)")
        }
    }

    // MARK: Runs

    /// The trial's two operations one after the other; each keeps its own token (the first's
    /// exchange yields a1, the second's b2) whichever runs first.
    static func runSerially(_ trial: Trial, secondFirst: Bool, sub: String, on connection: PostgresConnection) async throws -> Outcome {
        try await setUp(trial.start, sub: sub, on: connection)
        var refusals: [String] = []
        let operations = [(trial.first, "a1"), (trial.second, "b2")]
        for (operation, token) in secondFirst ? operations.reversed() : operations {
            try await connection.simpleQuery("BEGIN")
            let refusal = try await perform(operation, sub: sub, token: token, on: connection)
            try await connection.simpleQuery(refusal == nil ? "COMMIT" : "ROLLBACK")
            refusals.append("\(operation): \(refusal ?? "ok")")
        }
        // Report refusals in the trial's order (first, second), whichever ran first.
        if secondFirst { refusals.reverse() }
        return try await outcome(sub: sub, refusals: refusals, on: connection)
    }

    static func runConcurrently(
        _ trial: Trial, sub: String, first: PostgresConnection, second: PostgresConnection, secondPID: Int32,
        observer: PostgresConnection
    ) async throws -> Outcome {
        try await setUp(trial.start, sub: sub, on: observer)
        try await first.simpleQuery("BEGIN")
        let firstRefusal = try await perform(trial.first, sub: sub, token: "a1", on: first)
        if firstRefusal != nil { try await first.simpleQuery("ROLLBACK") }
        try await second.simpleQuery("BEGIN")
        let operation = trial.second
        let finished = LockedBox(false)
        let running = Task {
            defer { finished.value = true }
            return try await perform(operation, sub: sub, token: "b2", on: second)
        }
        // The second either finishes its statements or waits for a lock the first holds (nothing
        // else holds any).
        var blocked = false
        try await waitUntil("the second operation ran or waited for a lock", timeout: .seconds(60), every: .milliseconds(2)) {
            if finished.value { return true }
            let waitType = try await observer.query("SELECT wait_event_type FROM pg_stat_activity WHERE pid = \(secondPID)")
                .first?.decode(String?.self, at: 0)
            blocked = waitType == "Lock"
            return blocked
        }
        let secondRefusal: String?
        let between: [String]
        if blocked || !trial.secondCommitsFirst {
            if firstRefusal == nil { try await first.simpleQuery("COMMIT") }
            between = try await changes(sub: sub, on: observer)
            secondRefusal = try await running.value
            try await second.simpleQuery(secondRefusal == nil ? "COMMIT" : "ROLLBACK")
        } else {
            secondRefusal = try await running.value
            try await second.simpleQuery(secondRefusal == nil ? "COMMIT" : "ROLLBACK")
            between = try await changes(sub: sub, on: observer)
            if firstRefusal == nil { try await first.simpleQuery("COMMIT") }
        }
        var result = try await outcome(
            sub: sub, refusals: ["\(trial.first): \(firstRefusal ?? "ok")", "\(trial.second): \(secondRefusal ?? "ok")"], on: observer)
        result.blocked = blocked
        // What a reader saw between the commits stays the start of the account's changes: a later
        // commit never slips a change in before one already visible (webhooks deliver per account
        // in id order, and a feed reader moved past them).
        result.changesSeenBetweenCommitsArePrefix = result.changes.starts(with: between)
        if !result.changesSeenBetweenCommitsArePrefix { result.refusals.append("between the commits a reader saw \(between)") }
        return result
    }

    /// The read-first operation (the trial's second when `splitSecond`) reads, the other runs and
    /// commits, then the first writes what it read.
    static func runSplit(_ trial: Trial, splitSecond: Bool, sub: String, on connection: PostgresConnection) async throws -> Outcome {
        try await setUp(trial.start, sub: sub, on: connection)
        let (split, splitToken, other, otherToken) =
            splitSecond ? (trial.second, "b2", trial.first, "a1") : (trial.first, "a1", trial.second, "b2")
        let reading = try await read(split, sub: sub, on: connection)
        try await connection.simpleQuery("BEGIN")
        let otherRefusal = try await perform(other, sub: sub, token: otherToken, on: connection)
        try await connection.simpleQuery(otherRefusal == nil ? "COMMIT" : "ROLLBACK")
        try await connection.simpleQuery("BEGIN")
        let splitRefusal = try await perform(split, sub: sub, token: splitToken, reading: reading, on: connection)
        try await connection.simpleQuery(splitRefusal == nil ? "COMMIT" : "ROLLBACK")
        let refusals = ["\(split): \(splitRefusal ?? "ok")", "\(other): \(otherRefusal ?? "ok")"]
        return try await outcome(sub: sub, refusals: splitSecond ? refusals.reversed() : refusals, on: connection)
    }

    // MARK: Setting up, acting, observing

    static func setUp(_ start: Start, sub: String, on connection: PostgresConnection) async throws {
        if let status = start.status {
            _ = try await connection.execute(
                """
                INSERT INTO siwa.accounts (client_id, sub, app_user_id, status, refresh_token_enc, linked_at, updated_at)
                VALUES (\(clientID), \(sub), 'user-0', \(status), CASE WHEN \(status) = 'active' THEN '\\x00'::bytea END,
                        now() - interval '1 hour', now() - interval '1 hour')
                """)
        }
        if start.linkQueued {
            _ = try await connection.query("SELECT siwa.link_account(\(clientID), \(sub), 'user-1', 'code-1')")
        }
        if start.deletionRequested {
            _ = try await connection.query("SELECT siwa.request_deletion(\(clientID), \(sub))")
        }
        if start.reconcileQueued {
            _ = try await connection.execute(
                "INSERT INTO siwa.jobs (kind, priority, client_id, sub, max_attempts) VALUES ('reconcile', 3, \(clientID), \(sub), 5)")
        }
        for (index, type) in start.notifications.enumerated() {
            // Newer than any link this run makes, so whether each applies does not hang on a clock.
            _ = try await connection.execute(
                """
                INSERT INTO siwa.notifications (jti, client_id, sub, event_type, event_time, email, is_private_email, claims, jws)
                VALUES (\(sub + ".n\(index)"), \(clientID), \(sub), \(type), now() + interval '1 day' + \(Double(index))::float8 * interval '1 s',
                        'x@privaterelay.appleid.com', true, '{}'::jsonb, 'header.payload.signature')
                """)
        }
    }

    /// Runs `operation` in the connection's open transaction; a refusal (an SQLSTATE the caller
    /// gets) is returned, and the caller rolls back.
    static func read(_ operation: Operation, sub: String, on connection: PostgresConnection) async throws -> Reading? {
        switch operation {
        case .signIn:
            // The app API reads the account (and how many deletions were asked for) before it
            // exchanges the code, and refuses a pending deletion there (403).
            let read = try await connection.query(
                "SELECT status, deletion_requests FROM siwa.accounts WHERE client_id = \(clientID) AND sub = \(sub)")
            return .signIn(
                pendingDeletion: try read.first?.decode(String.self, column: "status") == "pending_deletion",
                deletionRequestsSeen: try read.first?.decode(Int64.self, column: "deletion_requests") ?? 0)
        case .reconcileValid, .reconcileInvalid:
            return .reconcile(
                storedToken: try await connection.query(
                    "SELECT refresh_token_enc FROM siwa.accounts WHERE client_id = \(clientID) AND sub = \(sub)"
                ).first?.decode([UInt8]?.self, at: 0))
        default:
            return nil
        }
    }

    static func perform(
        _ operation: Operation, sub: String, token: String, reading: Reading? = nil, on connection: PostgresConnection
    ) async throws -> String? {
        do {
            var reading = reading
            if reading == nil { reading = try await read(operation, sub: sub, on: connection) }
            switch operation {
            case .link:
                _ = try await connection.query("SELECT siwa.link_account(\(clientID), \(sub), 'user-2', 'code-2')")
            case .requestDeletion:
                _ = try await connection.query("SELECT siwa.request_deletion(\(clientID), \(sub))")
            case .requestDeletionWithCode:
                _ = try await connection.query("SELECT siwa.request_deletion(\(clientID), \(sub), 'code-3')")
            case .applyNotification:
                _ = try await JobQueue.runNotificationBatch(
                    on: connection, worker: "model", limit: 1, lease: .seconds(60), policy: RetryPolicy(), isolate: false)
            case .exchangeSucceeded, .exchangeFailed:
                guard let job = try await claim("exchange", sub: sub, on: connection) else { return nil }
                if operation == .exchangeSucceeded {
                    _ = try await connection.query(
                        "SELECT siwa.exchange_succeeded(\(job.id), decode(\(token), 'hex'), 'x@privaterelay.appleid.com', true)")
                } else {
                    _ = try await connection.query("SELECT siwa.exchange_failed(\(job.id), \(job.attempt), 'invalid_grant')")
                }
            case .signIn:
                guard case .signIn(let pendingDeletion, let seen) = reading else { return "no reading" }
                if pendingDeletion { return "account_deleting" }
                _ = try await connection.query(
                    "SELECT * FROM siwa.sign_in(\(clientID), \(sub), 'x@privaterelay.appleid.com', true, decode(\(token), 'hex'), \(seen))")
            case .importToken:
                _ = try await connection.query("SELECT siwa.account_imported(\(clientID), \(sub), 'user-9', decode(\(token + "ff"), 'hex'))")
            case .reconcileValid, .reconcileInvalid:
                guard case .reconcile(let stored) = reading, let stored, let job = try await claim("reconcile", sub: sub, on: connection) else { return nil }
                _ = try await connection.query(
                    "SELECT siwa.reconcile_result(\(job.id), \(job.attempt), \(stored), \(operation == .reconcileValid ? "valid" : "invalid_grant"))")
            case .revoke:
                guard let job = try await claim("revoke", sub: sub, on: connection) else { return nil }
                for _ in 0..<10 {
                    let step = try await connection.query("SELECT action, token_enc FROM siwa.revoke_step(\(job.id), \(job.attempt))")[0]
                    guard try step.decode(String.self, column: "action") == "revoke" else { break }
                    _ = try await connection.query(
                        "SELECT siwa.revoke_succeeded(\(job.id), \(try step.decode([UInt8].self, column: "token_enc")))")
                }
            }
            return nil
        } catch let error as PostgresError where error.sqlState != nil {
            return "SQLSTATE \(error.sqlState ?? "")"
        }
    }

    /// Leases the account's oldest available job of `kind`, as a worker's claim does.
    static func claim(_ kind: String, sub: String, on connection: PostgresConnection) async throws -> (id: Int64, attempt: Int32)? {
        try await connection.query(
            """
            UPDATE siwa.jobs SET state = 'running', attempt = attempt + 1, locked_by = 'model', locked_until = now() + interval '1 minute'
             WHERE id = (SELECT id FROM siwa.jobs WHERE client_id = \(clientID) AND sub = \(sub) AND kind = \(kind)
                           AND state = 'available' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
            RETURNING id, attempt
            """
        ).first.map { (try $0.decode(Int64.self, column: "id"), try $0.decode(Int32.self, column: "attempt")) }
    }

    struct Outcome: Equatable, CustomStringConvertible {
        var account: String
        var jobs: [String]
        var changes: [String]
        var refusals: [String]
        /// Not part of the comparison: how the concurrent run went.
        var blocked = false
        var changesSeenBetweenCommitsArePrefix = true

        static func == (lhs: Outcome, rhs: Outcome) -> Bool {
            (lhs.account, lhs.jobs, lhs.changes, lhs.refusals) == (rhs.account, rhs.jobs, rhs.changes, rhs.refusals)
        }
        var description: String {
            "  account \(account)\n  jobs \(jobs)\n  changes \(changes)\n  \(refusals.joined(separator: "; "))"
        }
    }

    static func outcome(sub: String, refusals: [String], on connection: PostgresConnection) async throws -> Outcome {
        let account = try await connection.query(
            """
            SELECT concat_ws(' ', status, 'token=' || coalesce(encode(refresh_token_enc, 'hex'), '-'),
                             'retired=' || cardinality(retired_tokens_enc), 'email_forwarding=' || coalesce(email_forwarding, '-'),
                             'deletion_requests=' || deletion_requests, 'app_user_id=' || coalesce(app_user_id, '-'),
                             'sessions_revoked=' || (sessions_revoked_at IS NOT NULL))
              FROM siwa.accounts WHERE client_id = \(clientID) AND sub = \(sub)
            """
        ).first?.decode(String.self, at: 0)
        let jobs = try await connection.query(
            """
            SELECT kind || '/' || state || coalesce('/' || outcome, '') FROM siwa.jobs
             WHERE client_id = \(clientID) AND sub = \(sub) ORDER BY 1
            """
        ).map { try $0.decode(String.self, at: 0) }
        return Outcome(account: account ?? "none", jobs: jobs, changes: try await changes(sub: sub, on: connection), refusals: refusals)
    }

    static func changes(sub: String, on connection: PostgresConnection) async throws -> [String] {
        try await connection.query(
            """
            SELECT change || '/' || coalesce(status, '-') || coalesce('/' || reason, '') FROM siwa.account_changes
             WHERE client_id = \(clientID) AND sub = \(sub) ORDER BY id
            """
        ).map { try $0.decode(String.self, at: 0) }
    }
}
