import AppleClient
import FakeApple
import Foundation
import Postgres
import Testing

/// What a team transfer must never do: bring back a user who is leaving, split or forge a user
/// through the file, or let an app session bind someone's line to a `sub` Apple never vouched for.
@Suite(.serialized) struct TeamTransferSafetyTests {
    typealias Harness = TransferHarness

    /// Only `active` accounts move: the recipient creates every line's account `active`, so a user
    /// whose deletion is pending would come back. The others are counted by status on stderr, and
    /// Apple is not even asked for their identifiers.
    @Test func exportSkipsAccountsThatAreNotActiveAndCountsThemByStatus() async throws {
        let harness = try Harness()
        defer { harness.stop() }
        try await Harness.withSender(accounts: 6) { sender, a in
            try await a.simpleQuery(
                """
                UPDATE siwa.accounts SET status = 'pending_deletion' WHERE sub IN ('sub-0002', 'sub-0003');
                UPDATE siwa.accounts SET status = 'consent_revoked' WHERE sub = 'sub-0004';
                UPDATE siwa.accounts SET status = 'deleted' WHERE sub = 'sub-0005';
                UPDATE siwa.accounts SET app_user_id = NULL WHERE sub = 'sub-0006';
                """)
            let run = try await harness.run(["export", "--target-team", Harness.teamB], team: Harness.teamA, database: sender)
            #expect(run.status == 0, "\(run.stderr)")
            #expect(run.stdout.split(separator: "\n") == ["transfer_sub,app_user_id", "\(transferSub("sub-0001")),user-0001"])
            let skipped = try #require(run.stderr.split(separator: "\n").first { $0.contains("skipped") }, "\(run.stderr)")
            #expect(skipped.hasSuffix("1 consent_revoked, 1 deleted, 1 no_app_user_id, 2 pending_deletion"), "\(skipped)")
            #expect(harness.fake.migrationAnswers.keys.sorted() == ["sub-0001"])
        }
    }

    /// Each record is one physical line: an `app_user_id` holding a line break, a quote, a comma
    /// or a backslash crosses from one team's database to the other's exactly as it was.
    @Test func appUserIDsWithLineBreaksAndQuotesReadBackExactly() async throws {
        let users = [
            "line\nbreak", "crlf\r\nbreak", "say \"hi\"", "\"\n\"", "comma, and \\ backslash", "back\\n slash-n",
            "trailing space ", "tab\tand bell\u{07}", "line\u{2028}separator", "plain-user",
        ]
        let harness = try Harness()
        defer { harness.stop() }
        try await Harness.withSender(accounts: users.count) { sender, a in
            try await withMigratedDatabase { recipient in
                for (index, user) in users.enumerated() {
                    let sub = "sub-" + TeamTransferTests.number(index + 1)
                    _ = try await a.execute("UPDATE siwa.accounts SET app_user_id = \(user) WHERE sub = \(sub)")
                }
                let export = try await harness.run(["export", "--target-team", Harness.teamB], team: Harness.teamA, database: sender)
                #expect(export.status == 0, "\(export.stderr)")
                // Split as `wc -l` would: one line per user and the header, nothing cut in two.
                #expect(export.stdout.utf8.filter { $0 == UInt8(ascii: "\n") }.count == users.count + 1, "\(export.stdout)")
                #expect(!export.stdout.utf8.contains(UInt8(ascii: "\r")), "\(export.stdout)")

                let imported = try await harness.run(["import"], team: Harness.teamB, database: recipient, stdin: export.stdout)
                #expect(imported.status == 0, "\(imported.stderr)")
                let b = try await recipient.connect()
                defer { b.close() }
                let rows = try await b.query("SELECT sub, app_user_id FROM siwa.accounts")
                var arrived: [String: String] = [:]
                for row in rows { arrived[try row.decode(String.self, column: "sub")] = try row.decode(String.self, column: "app_user_id") }
                var expected: [String: String] = [:]
                for (index, user) in users.enumerated() {
                    let sub = "sub-" + TeamTransferTests.number(index + 1)
                    expected[FakeApple.migratedIdentity(of: sub, fromTeam: Harness.teamA, toTeam: Harness.teamB).sub] = user
                }
                #expect(arrived == expected)
            }
        }
    }

    /// `siwa.claim_transfer` takes the `sub` it is given as proven: an app session could hand any
    /// imported user's line (and so their app_user_id) to an account of its choosing. Only the
    /// worker, which has checked Apple's signed identity token, may call it.
    @Test func claimTransferIsRefusedToTheAppRole() async throws {
        try await withMigratedDatabase { database in
            let admin = try await database.connect()
            defer { admin.close() }
            try await admin.simpleQuery(
                "INSERT INTO siwa.transfer_imports (client_id, transfer_sub, app_user_id) VALUES ('com.example.app', 't.1', 'user-1')")
            let claim: PostgresQuery =
                "SELECT siwa.claim_transfer('com.example.app', 't.1', 'attacker-sub', 'x@privaterelay.appleid.com', true)"
            try await database.withLogin(inRole: "siwa_app") { url in
                let app = try await PostgresConnection.connect(to: url, logger: TestDatabase.logger)
                defer { app.close() }
                let refusal = await #expect(throws: PostgresError.self) { try await app.query(claim) }
                #expect(refusal?.sqlState == "42501", "\(String(describing: refusal))")
            }
            #expect(try await admin.query("SELECT state FROM siwa.transfer_imports")[0].decode(String.self, at: 0) == "pending")
            #expect(try await admin.query("SELECT count(*) FROM siwa.accounts")[0].decode(Int.self, at: 0) == 0)
            // The worker's path (the app API's sign-in, after verifying the token) still claims.
            try await database.withLogin(inRole: "siwa_worker") { url in
                let worker = try await PostgresConnection.connect(to: url, logger: TestDatabase.logger)
                defer { worker.close() }
                #expect(try await worker.query(claim)[0].decode(String?.self, at: 0) == "user-1")
            }
        }
    }

    private func transferSub(_ sub: String) -> String {
        FakeApple.transferSub(sub: sub, clientID: Harness.clientID, fromTeam: Harness.teamA, toTeam: Harness.teamB)
    }
}
