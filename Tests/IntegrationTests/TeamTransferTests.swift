import AppleClient
import CryptoCore
import FakeApple
import Foundation
import JobQueue
import Logging
import Postgres
import Testing
import TeamTransfer
import TestTiming

/// `siwa accounts transfer export` / `import` against a fake Apple that knows two teams, over real
/// databases (the sending team's and the recipient's), as the operator would run them.
@Suite(.serialized) struct TeamTransferTests {
    typealias Harness = TransferHarness

    static func number(_ n: Int) -> String { String(format: "%04d", n) }

    /// The issue's "Done when": 1,000 linked accounts move from team A to team B through both
    /// commands, with 5xx, 429 and a timeout injected on the way and each command interrupted
    /// (SIGKILL) once and resumed; sign-ins through the app API carrying `transfer_sub` (one before
    /// the import reached the user, one after) land on the right app_user_id.
    @Test func thousandLinkedAccountsMoveToAnotherTeam() async throws {
        let harness = try Harness()
        defer { harness.stop() }
        try await withMigratedDatabase { sender in
            try await withMigratedDatabase { recipient in
                let a = try await sender.connect()
                defer { a.close() }
                try await Harness.seedAccounts(1000, on: a)
                try await a.simpleQuery(
                    """
                    INSERT INTO siwa.accounts (client_id, sub, status) VALUES ('com.example.app', 'sub-unlinked', 'active');
                    INSERT INTO siwa.accounts (client_id, sub, app_user_id, status)
                    VALUES ('com.example.app', 'sub-deleted', 'user-deleted', 'deleted');
                    """)
                harness.fake.injectFailures(endpoint: "token", responses: [.status(502)])
                harness.fake.injectFailures(
                    endpoint: "usermigrationinfo", responses: [.status(503), .status(429), .timeout, .status(500), .status(429)])

                // Sending side, interrupted once.
                let export = ["export", "--target-team", Harness.teamB, "--rate", "400", "--concurrency", "4"]
                // Apple stops answering after 300 calls (5 of them the failures above), so the kill
                // lands part-way whatever the machine's speed.
                harness.fake.closeGate(endpoint: "usermigrationinfo", after: 300)
                let interrupted = try harness.start(export, team: Harness.teamA, database: sender)
                let obtained = "SELECT count(*) FROM siwa.accounts WHERE transfer_sub IS NOT NULL"
                try await waitUntil(interrupted, "290 identifiers stored, then Apple silent") {
                    try await count(a, obtained) >= 290 && harness.fake.parkedCalls(endpoint: "usermigrationinfo") > 0
                }
                interrupted.kill()
                harness.fake.openGate(endpoint: "usermigrationinfo")
                #expect(try await count(a, obtained) < 1000, "the interruption came too late to prove anything")

                let resumed = try await harness.run(export, team: Harness.teamA, database: sender)
                #expect(resumed.status == 0, "\(resumed.stderr)")
                let lines = resumed.stdout.split(separator: "\n").map(String.init)
                #expect(lines.first == "transfer_sub,app_user_id")
                #expect(lines.count == 1001)
                var expected: [String: String] = [:]
                for n in 1...1000 {
                    expected["user-\(Self.number(n))"] = FakeApple.transferSub(
                        sub: "sub-\(Self.number(n))", clientID: Harness.clientID, fromTeam: Harness.teamA, toTeam: Harness.teamB)
                }
                var exported: [String: String] = [:]
                for line in lines.dropFirst() {
                    let fields = line.split(separator: ",").map(String.init)
                    exported[fields[1]] = fields[0]
                }
                #expect(exported == expected)
                #expect(!resumed.stdout.contains("sub-"), "the export must not hold a team-scoped sub")
                #expect(!resumed.stdout.contains("@"), "the export must not hold an email address")
                // Identifiers stored before the interruption were not asked again: only calls in
                // flight at the kill may repeat.
                let answers = harness.fake.migrationAnswers
                let perSub = (1...1000).map { answers["sub-\(Self.number($0))"] ?? 0 }
                #expect(perSub.allSatisfy { $0 >= 1 })
                #expect(perSub.reduce(0, +) <= 1000 + 4)
                let statuses = Set(harness.fake.calls.filter { $0.endpoint == "usermigrationinfo" }.map(\.status))
                #expect(statuses.isSuperset(of: [503, 429, 500, 0]), "\(statuses)")

                // Recipient side, into team B's own database: interrupted once, a sign-in meanwhile.
                harness.fake.injectFailures(endpoint: "usermigrationinfo", responses: [.status(503), .status(429), .status(502)])
                let b = try await recipient.connect()
                defer { b.close() }
                let importing = ["import", "--rate", "400", "--concurrency", "4"]
                harness.fake.closeGate(endpoint: "usermigrationinfo", after: 300)
                let firstImport = try harness.start(importing, team: Harness.teamB, database: recipient, stdin: resumed.stdout)
                let done = "SELECT count(*) FROM siwa.transfer_imports WHERE state = 'done'"
                try await waitUntil(firstImport, "290 lines done, then Apple silent") {
                    try await count(b, done) >= 290 && harness.fake.parkedCalls(endpoint: "usermigrationinfo") > 0
                }
                firstImport.kill()
                harness.fake.openGate(endpoint: "usermigrationinfo")
                #expect(try await count(b, done) < 1000, "the interruption came too late to prove anything")

                // A user signs in (app API, POST /v1/sign-in) before the import reached them: Apple's
                // identity token carries their new sub and transfer_sub.
                let api = try await TransferSignIn(harness: harness, database: recipient)
                let waiting = try #require(
                    try await b.query(
                        "SELECT transfer_sub, app_user_id FROM siwa.transfer_imports WHERE state = 'pending' ORDER BY transfer_sub DESC LIMIT 1"
                    ).first)
                let waitingTransferSub = try waiting.decode(String.self, column: "transfer_sub")
                let waitingUser = try waiting.decode(String.self, column: "app_user_id")
                let early = try await api.signIn(originalSub: "sub-" + waitingUser.dropFirst(5), transferSub: waitingTransferSub)
                #expect(early.status == 200, "\(early.body)")
                #expect(early.body["app_user_id"] as? String == waitingUser)
                #expect(early.body["new"] as? Bool == false)

                let secondImport = try await harness.run(importing, team: Harness.teamB, database: recipient, stdin: resumed.stdout)
                #expect(secondImport.status == 0, "\(secondImport.stderr)")
                #expect(secondImport.stderr.contains("0 lines still pending"), "\(secondImport.stderr)")

                let rows = try await b.query(
                    """
                    SELECT sub, app_user_id, status, email, is_private_email, refresh_token_enc IS NULL AS no_token
                      FROM siwa.accounts WHERE client_id = 'com.example.app'
                    """)
                #expect(rows.count == 1000)
                var mismatches = 0
                for row in rows {
                    let user = try row.decode(String.self, column: "app_user_id")
                    let identity = FakeApple.migratedIdentity(
                        of: "sub-" + user.dropFirst(5), fromTeam: Harness.teamA, toTeam: Harness.teamB)
                    if try row.decode(String.self, column: "sub") != identity.sub
                        || row.decode(String?.self, column: "email") != identity.email
                        || row.decode(Bool?.self, column: "is_private_email") != identity.isPrivateEmail
                        || row.decode(String.self, column: "status") != "active"
                        || !row.decode(Bool.self, column: "no_token")
                    {
                        mismatches += 1
                    }
                }
                #expect(mismatches == 0)
                let reasons = try await b.query(
                    "SELECT reason, count(*) AS n FROM siwa.account_changes WHERE change = 'transferred' GROUP BY reason ORDER BY reason")
                #expect(try reasons.map { "\(try $0.decode(String.self, column: "reason"))=\(try $0.decode(Int.self, column: "n"))" }
                    == ["import=999", "sign_in=1"])
                // The line the sign-in completed was never exchanged at Apple.
                #expect(harness.fake.migrationAnswers[waitingTransferSub] == nil)

                // After both commands, a returning user's token still carries transfer_sub (60 days):
                // the sign-in lands on the account the import made.
                let returning = try await api.signIn(originalSub: "sub-0001", transferSub: expected["user-0001"]!)
                await api.stop()
                #expect(returning.status == 200, "\(returning.body)")
                #expect(returning.body["app_user_id"] as? String == "user-0001")
                #expect(returning.body["new"] as? Bool == false)
                #expect(try await count(b, "SELECT count(*) FROM siwa.account_changes WHERE change = 'transferred'") == 1000)
                #expect(try await count(b, "SELECT count(*) FROM siwa.accounts") == 1000)
            }
        }
    }

    // MARK: Failures

    @Test func invalidClientStopsTheExportWithOneLineNamingTheClientID() async throws {
        let harness = try Harness()
        defer { harness.stop() }
        try await withMigratedDatabase { sender in
            let a = try await sender.connect()
            defer { a.close() }
            try await Harness.seedAccounts(3, on: a)
            // Team A's ID with team B's key: Apple cannot verify the client_secret.
            var environment = harness.environment(team: Harness.teamA, database: sender)
            environment["SIWA_PRIVATE_KEY_FILE"] = harness.directory.appendingPathComponent("\(Harness.teamB).p8").path
            let run = try CommandRun(
                ["accounts", "transfer", "export", "--target-team", Harness.teamB], environment: environment, stdin: nil,
                in: harness.directory)
            #expect(await run.waitForExit(timeout: .seconds(60)) == 1)
            let lines = run.stderr.split(separator: "\n")
            let fault = lines.filter { $0.contains("invalid_client") }
            #expect(fault.count == 1, "\(run.stderr)")
            #expect(fault.first?.contains(Harness.clientID) == true)
            #expect(run.stdout.isEmpty)
            #expect(try await count(a, "SELECT count(*) FROM siwa.accounts WHERE transfer_sub IS NOT NULL") == 0)
        }
    }

    @Test func badUsageExitsTwoWithOneLineNamingWhatIsWrong() async throws {
        let harness = try Harness()
        defer { harness.stop() }
        let environment = harness.environment(team: Harness.teamA, databaseURL: "postgresql://127.0.0.1:1/none")
        for (arguments, named) in [
            (["accounts", "transfer"], "usage"), (["accounts", "transfer", "export"], "--target-team"),
            (["accounts", "transfer", "export", "--target-team", "lowercase1"], "--target-team"),
            (["accounts", "transfer", "export", "--target-team", Harness.teamA], "--target-team"),
            (["accounts", "transfer", "import", "--rate", "0"], "--rate"),
        ] {
            let run = try CommandRun(arguments, environment: environment, stdin: nil, in: harness.directory)
            let status = await run.waitForExit(timeout: .seconds(30))
            #expect(status == 2, "\(arguments): \(run.stderr)")
            #expect(run.stderr.split(separator: "\n").count == 1 && run.stderr.contains(named), "\(arguments): \(run.stderr)")
        }
    }

    @Test func anAccountAppleRefusesIsCountedAndAskedAgainNextRun() async throws {
        let harness = try Harness()
        defer { harness.stop() }
        try await withMigratedDatabase { sender in
            let a = try await sender.connect()
            defer { a.close() }
            try await Harness.seedAccounts(5, on: a)
            harness.fake.refuseMigration(sub: "sub-0003")
            let export = ["export", "--target-team", Harness.teamB]
            let first = try await harness.run(export, team: Harness.teamA, database: sender)
            #expect(first.status == 1)
            #expect(first.stderr.contains("1 invalid_request"), "\(first.stderr)")
            #expect(first.stdout.split(separator: "\n").count == 5)  // header + 4
            #expect(!first.stdout.contains("user-0003"))

            let second = try await harness.run(export, team: Harness.teamA, database: sender)
            #expect(second.status == 1)
            let answers = harness.fake.migrationAnswers
            #expect(["sub-0001", "sub-0002", "sub-0004", "sub-0005"].map { answers[$0] } == [1, 1, 1, 1])
            let refusedCalls = harness.fake.calls.filter { $0.endpoint == "usermigrationinfo" && $0.status == 400 }.count
            #expect(refusedCalls == 2)  // once per run, not retried within a run
        }
    }

    @Test func importReportsMalformedAndConflictingLinesByNumberAndDoesTheRest() async throws {
        let harness = try Harness()
        defer { harness.stop() }
        try await withMigratedDatabase { sender in
            try await withMigratedDatabase { recipient in
                let a = try await sender.connect()
                defer { a.close() }
                try await Harness.seedAccounts(2, on: a)
                let export = try await harness.run(["export", "--target-team", Harness.teamB], team: Harness.teamA, database: sender)
                #expect(export.status == 0, "\(export.stderr)")
                let good = export.stdout.split(separator: "\n").dropFirst().map(String.init)
                let firstTransferSub = String(good[0].split(separator: ",")[0])
                let file = [
                    "transfer_sub,app_user_id", good[0], "secret-looking-garbage", ",user-x", "has space,user-y",
                    "\(firstTransferSub),someone-else", "", good[1],
                ].joined(separator: "\n")
                let run = try await harness.run(["import"], team: Harness.teamB, database: recipient, stdin: file)
                #expect(run.status == 1)
                for number in [3, 4, 5] { #expect(run.stderr.contains("line \(number): malformed"), "\(run.stderr)") }
                #expect(run.stderr.contains("line 6: transfer_sub already recorded with another app_user_id"))
                #expect(!run.stderr.contains("secret-looking-garbage"), "lines are reported by number, not content")
                let b = try await recipient.connect()
                defer { b.close() }
                #expect(try await count(b, "SELECT count(*) FROM siwa.accounts WHERE app_user_id IN ('user-0001', 'user-0002')") == 2)
                #expect(try await count(b, "SELECT count(*) FROM siwa.accounts WHERE app_user_id = 'someone-else'") == 0)
            }
        }
    }

    // MARK: Same database, sign-in rules

    /// The back end moves with the app: the recipient's database is the sender's. The accounts are
    /// re-keyed to the new subs (no second row), keep their app_user_id and lose the old team's
    /// tokens (sealed with the old sub); a deletion then ends `no_token`, as deploy/README.md says.
    @Test func importIntoTheSendersDatabaseReKeysTheAccounts() async throws {
        let harness = try Harness()
        defer { harness.stop() }
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            try await Harness.seedAccounts(3, on: connection)
            try await connection.simpleQuery("UPDATE siwa.accounts SET retired_tokens_enc = ARRAY['\\x0304'::bytea] WHERE sub = 'sub-0001'")
            let export = try await harness.run(["export", "--target-team", Harness.teamB], team: Harness.teamA, database: database)
            #expect(export.status == 0, "\(export.stderr)")
            let run = try await harness.run(["import"], team: Harness.teamB, database: database, stdin: export.stdout)
            #expect(run.status == 0, "\(run.stderr)")
            let rows = try await connection.query(
                """
                SELECT sub, app_user_id, status, refresh_token_enc IS NULL AS no_token, transfer_sub IS NULL AS cleared
                  FROM siwa.accounts ORDER BY app_user_id
                """)
            #expect(rows.count == 3)
            for (index, row) in rows.enumerated() {
                let n = Self.number(index + 1)
                let identity = FakeApple.migratedIdentity(of: "sub-\(n)", fromTeam: Harness.teamA, toTeam: Harness.teamB)
                #expect(try row.decode(String.self, column: "sub") == identity.sub)
                #expect(try row.decode(String.self, column: "app_user_id") == "user-\(n)")
                #expect(try row.decode(String.self, column: "status") == "active")
                #expect(try row.decode(Bool.self, column: "no_token"))
                #expect(try row.decode(Bool.self, column: "cleared"))
            }
            #expect(try await count(connection, "SELECT count(*) FROM siwa.accounts WHERE retired_tokens_enc <> '{}'") == 0)

            // The app deletes a re-keyed user: nothing is left to revoke at Apple.
            let newSub = FakeApple.migratedIdentity(of: "sub-0001", fromTeam: Harness.teamA, toTeam: Harness.teamB).sub
            let job = try await connection.query("SELECT siwa.request_deletion(\(Harness.clientID), \(newSub)) AS id")[0]
                .decode(Int64.self, column: "id")
            _ = try await connection.execute(
                "UPDATE siwa.jobs SET state = 'running', attempt = 1, locked_until = now() + interval '1 minute' WHERE id = \(job)")
            let step = try await connection.query("SELECT action FROM siwa.revoke_step(\(job), 1)")[0].decode(String.self, at: 0)
            #expect(step == "deleted")
            let reason = try await connection.query(
                "SELECT reason FROM siwa.account_changes WHERE sub = \(newSub) AND change = 'deleted'")
            #expect(try reason.first?.decode(String?.self, at: 0) == "no_token")
        }
    }

    @Test func claimTransferCompletesAPendingLineOnceAndNeverRevivesADeletion() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            try await connection.simpleQuery(
                """
                INSERT INTO siwa.transfer_imports (client_id, transfer_sub, app_user_id) VALUES
                  ('com.example.app', 't.1', 'user-1'), ('com.example.app', 't.2', 'user-2');
                INSERT INTO siwa.accounts (client_id, sub, status) VALUES ('com.example.app', 'new-2', 'pending_deletion');
                """)
            func claim(_ transferSub: String, _ sub: String) async throws -> String? {
                try await connection.query(
                    "SELECT siwa.claim_transfer('com.example.app', \(transferSub), \(sub), 'x@privaterelay.appleid.com', true)"
                )[0].decode(String?.self, at: 0)
            }
            #expect(try await claim("t.1", "new-1") == "user-1")
            #expect(try await claim("t.1", "new-1") == "user-1")  // idempotent
            #expect(try await claim("t.1", "other") == nil)  // the line belongs to new-1
            #expect(try await claim("t.unknown", "new-9") == nil)
            #expect(try await claim("t.2", "new-2") == nil)  // being deleted: skipped, not revived
            let account = try await connection.query(
                "SELECT app_user_id, status, refresh_token_enc IS NULL AS no_token FROM siwa.accounts WHERE sub = 'new-1'")[0]
            #expect(try account.decode(String.self, column: "app_user_id") == "user-1")
            #expect(try account.decode(String.self, column: "status") == "active")
            #expect(try account.decode(Bool.self, column: "no_token"))
            #expect(try await count(connection, "SELECT count(*) FROM siwa.account_changes WHERE change = 'transferred'") == 1)
            #expect(try await count(connection, "SELECT count(*) FROM siwa.accounts WHERE sub = 'new-2' AND status = 'pending_deletion' AND app_user_id IS NULL") == 1)
            #expect(try await count(connection, "SELECT count(*) FROM siwa.transfer_imports WHERE state = 'skipped'") == 1)
        }
    }

    /// `siwa fake-apple` with a recipient team: the runbook can be rehearsed on one machine.
    @Test func theFakeAppleCommandServesBothTeams() async throws {
        let harness = try Harness()
        defer { harness.stop() }
        let key = { (team: String) in harness.directory.appendingPathComponent("\(team).p8").path }
        let fake = try ServiceProcess(
            "siwa",
            arguments: [
                "fake-apple", "--listen", "127.0.0.1:0", "--team-id", Harness.teamA, "--verify-key-file", key(Harness.teamA),
                "--recipient-team-id", Harness.teamB, "--recipient-verify-key-file", key(Harness.teamB),
            ],
            environment: [:])
        let url = try await EndToEndStack.waitForListening(fake)
        try await withMigratedDatabase { sender in
            try await withMigratedDatabase { recipient in
                let a = try await sender.connect()
                defer { a.close() }
                try await Harness.seedAccounts(2, on: a)
                func run(_ arguments: [String], team: String, database: MigratedDatabase, stdin: String? = nil) async throws -> CommandRun {
                    var environment = harness.environment(team: team, database: database)
                    environment["SIWA_APPLE_BASE_URL"] = url
                    let run = try CommandRun(["accounts", "transfer"] + arguments, environment: environment, stdin: stdin, in: harness.directory)
                    _ = await run.waitForExit(timeout: .seconds(60))
                    return run
                }
                let export = try await run(["export", "--target-team", Harness.teamB], team: Harness.teamA, database: sender)
                #expect(export.status == 0, "\(export.stderr)")
                let imported = try await run(["import"], team: Harness.teamB, database: recipient, stdin: export.stdout)
                #expect(imported.status == 0, "\(imported.stderr)")
                let b = try await recipient.connect()
                defer { b.close() }
                #expect(try await count(b, "SELECT count(*) FROM siwa.accounts WHERE app_user_id IN ('user-0001', 'user-0002')") == 2)
            }
        }
        await fake.stop()
    }

    // MARK: The Apple client

    /// Apple's access tokens last an hour; a long export outlives one. An expired token is
    /// answered 401 and the caller asks for a new one instead of failing the account.
    @Test func anExpiredMigrationTokenIsRenewed() async throws {
        let harness = try Harness()
        defer { harness.stop() }
        let key = try P256.Signing.PrivateKey(
            pemRepresentation: String(contentsOf: harness.directory.appendingPathComponent("\(Harness.teamA).p8"), encoding: .utf8))
        let client = AppleAuthClient(
            http: AppleHTTP(baseURL: harness.fake.baseURL),
            signer: ClientSecretSigner(teamID: Harness.teamA, keyID: Harness.keyID, privateKey: key))
        let caller = MigrationCaller(
            client: client, clientID: Harness.clientID, settings: MigrationCallSettings(rate: 1000, retry: .init(base: .milliseconds(10))),
            logger: Logger(label: "test", level: .warning))
        for sub in ["sub-1", "sub-2"] {
            let outcome = try await caller.perform { token in
                await client.transferSub(sub: sub, targetTeam: Harness.teamB, clientID: Harness.clientID, accessToken: token)
            }
            guard case .success = outcome else {
                Issue.record("\(sub): \(outcome)")
                return
            }
            harness.fake.expireMigrationTokens()
        }
        let tokenCalls = harness.fake.calls.filter { $0.endpoint == "token" && $0.grantType == "client_credentials" }
        #expect(tokenCalls.count == 2)
        #expect(harness.fake.calls.filter { $0.endpoint == "usermigrationinfo" }.map(\.status) == [200, 401, 200])
    }
}

private func count(_ connection: PostgresConnection, _ sql: String) async throws -> Int {
    try await connection.query(PostgresQuery(unsafeSQL: sql))[0].decode(Int.self, at: 0)
}

/// `waitUntil`, failing early when the command exits first (its stderr says why).
private func waitUntil(_ run: CommandRun, _ what: String, _ condition: () async throws -> Bool) async throws {
    try await TestTiming.waitUntil(what, timeout: .seconds(60), every: .milliseconds(10), detail: run.stderr) {
        if try await condition() { return true }
        guard run.isRunning else { throw ServiceProcessError(message: "exited (\(run.status)) before \(what):\n\(run.stderr)") }
        return false
    }
}
