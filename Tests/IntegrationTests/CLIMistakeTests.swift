import Foundation
import Postgres
import Testing

/// The operator's day two (Sources/OperatorCommands/README.md, "Mistakes"): no command answers a
/// mistake with a misleading line.
/// `--flag=value` reads as `--flag value` for every command; a stray word or an unknown flag exits 2
/// naming it; retrying or cancelling a job that does not exist exits 1 saying so; an unreachable
/// database is one sentence; the help says what a command really needs.
@Suite(.serialized) struct CLIMistakeTests {
    /// One value flag of each command, given as `--flag=bad`: the error names that flag (so the
    /// `=` form reached it), and nothing ran.
    static let equalsForms: [(arguments: [String], names: String)] = [
        (["migrate", "--database-url=not a url"], "DATABASE_URL"),
        (["status", "--database-url=not a url"], "DATABASE_URL"),
        (["jobs", "list", "--limit=0", "--database-url=postgresql://127.0.0.1:1/x"], "--limit"),
        (["jobs", "cancel", "--sub=s1", "--kind=nope", "--database-url=postgresql://127.0.0.1:1/x"], "--kind"),
        (["dev", "--siwa-dev-ready-timeout=0"], "SIWA_DEV_READY_TIMEOUT"),
        (["fake-apple", "--listen=nowhere"], "--listen"),
        (["simulate", "consent-revoked", "--sub=s1", "--client-id=c", "--event-time=soon"], "--event-time"),
        (["accounts", "import", "--siwa-token-keys=short", "--database-url=postgresql://127.0.0.1:1/x"], "SIWA_TOKEN_KEYS"),
        (["webhooks", "sink", "--listen=nowhere"], "--listen"),
        (["console", "--listen=nowhere", "--database-url=postgresql://127.0.0.1:1/x"], "--listen"),
    ]

    @Test(arguments: 0..<equalsForms.count) func flagEqualsValueReachesTheFlag(_ index: Int) async throws {
        let (arguments, names) = Self.equalsForms[index]
        let run = try await Siwa.run(arguments, environment: [:], timeout: .seconds(30))
        #expect(run.status == 2, "\(arguments): \(run.stdout) \(run.stderr)")
        #expect(run.stderr.contains(names), "\(arguments): \(run.stderr)")
        #expect(!run.stderr.contains("unknown option") && !run.stdout.contains("[dev]"), "\(arguments): \(run.stderr)")
    }

    /// And on a real database the `=` forms act: the filter, the target and the URL all arrive.
    @Test func flagEqualsValueWorksAgainstADatabase() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            let ids = try await connection.query(
                """
                INSERT INTO siwa.jobs (kind, state, client_id, sub, finalized_at) VALUES
                  ('notification', 'available', 'c', 'eq1', NULL), ('exchange', 'discarded', 'c', 'eq2', now())
                RETURNING id
                """).map { try $0.decode(Int64.self, column: "id") }
            let status = try await Siwa.run(["status", "--json", "--database-url=\(database.url)"], environment: [:])
            #expect(status.status == 0, "\(status.stderr)")
            let list = try await Siwa.run(["jobs", "list", "--state=discarded", "--json", "--database-url=\(database.url)"], environment: [:])
            let rows = try #require(try JSONSerialization.jsonObject(with: Data(list.stdout.utf8)) as? [[String: Any]], "\(list.stderr)")
            #expect(rows.map { $0["id"] as? Int } == [Int(ids[1])])
            let cancel = try await Siwa.run(["jobs", "cancel", "--sub=eq1", "--kind=notification"], environment: ["DATABASE_URL": database.url])
            #expect(cancel.status == 0 && cancel.stdout.contains("#\(ids[0]) notification"), "\(cancel.stdout) \(cancel.stderr)")
        }
    }

    /// A word the command does not take is named, exit 2, before anything runs (with a database
    /// given, so a command that ignored the word would have run and exited 0).
    static let strays: [[String]] = [
        ["migrate", "extra"], ["status", "extra"], ["jobs", "list", "extra"], ["jobs", "retry", "5", "extra"],
        ["jobs", "cancel", "5", "extra"], ["dev", "extra"], ["fake-apple", "extra"], ["simulate", "consent-revoked", "extra"],
        ["accounts", "import", "extra"], ["accounts", "transfer", "export", "extra"], ["webhooks", "test", "extra"],
        ["webhooks", "disable", "extra"], ["console", "extra"],
    ]

    @Test func strayArgumentsExitTwoNamingThem() async throws {
        try await withMigratedDatabase { database in
            for arguments in Self.strays {
                let run = try await Siwa.run(arguments, environment: ["DATABASE_URL": database.url], timeout: .seconds(30))
                #expect(run.status == 2, "\(arguments): \(run.stdout) \(run.stderr)")
                #expect(run.stderr.contains("\"extra\"") && run.stderr.contains("unexpected argument"), "\(arguments): \(run.stderr)")
                #expect(run.stderr.split(separator: "\n").count == 1, "\(arguments): \(run.stderr)")
                #expect(run.stdout.isEmpty, "\(arguments) ran: \(run.stdout)")
            }
        }
    }

    /// A misspelt flag at the end of the line is unknown (not "expects a value"); a switch given a
    /// value is refused rather than called unknown.
    @Test(arguments: CLIHelpTests.commands) func aTrailingUnknownFlagIsNamedAsUnknown(_ command: String) async throws {
        let run = try await Siwa.run([command, "--jsn"], environment: [:], timeout: .seconds(30))
        #expect(run.status == 2, "\(command): \(run.stderr)")
        #expect(run.stderr.contains("--jsn: unknown option"), "\(command): \(run.stderr)")
    }

    @Test func aSwitchGivenAValueSaysItTakesNone() async throws {
        for arguments in [["status", "--json=yes"], ["jobs", "list", "--json=true"], ["dev", "--once=1"]] {
            let run = try await Siwa.run(arguments, environment: [:], timeout: .seconds(30))
            let flag = String(arguments.last!.prefix { $0 != "=" })
            #expect(run.status == 2 && run.stderr.contains("\(flag): takes no value"), "\(arguments): \(run.stderr)")
        }
    }

    @Test func retryOrCancelOfAMissingJobExitsOneSayingSo() async throws {
        try await withMigratedDatabase { database in
            for action in ["retry", "cancel"] {
                let run = try await Siwa.run(["jobs", action, "99999"], environment: ["DATABASE_URL": database.url])
                #expect(run.status == 1, "\(action): \(run.stdout) \(run.stderr)")
                #expect(run.stderr.contains("no job #99999"), "\(action): \(run.stderr)")
                #expect(!run.stdout.contains("retried") && !run.stdout.contains("cancelled"), "\(action): \(run.stdout)")
            }
        }
    }

    /// Nothing listens on port 1: each database command says so in one sentence, without the
    /// error type's dump.
    @Test func anUnreachableDatabaseIsOneSentence() async throws {
        let url = "postgresql://postgres@127.0.0.1:1/none?connect_timeout=2"
        let key = Data(repeating: 7, count: 32).base64EncodedString()
        for arguments in [["migrate"], ["status"], ["jobs", "list"], ["jobs", "retry", "4"], ["webhooks", "disable"], ["accounts", "rotate-keys"]] {
            let run = try await Siwa.run(arguments, environment: ["DATABASE_URL": url, "SIWA_TOKEN_KEYS": "k1:\(key)"])
            #expect(run.status == 1, "\(arguments): \(run.stderr)")
            #expect(run.stderr.split(separator: "\n").count == 1, "\(arguments): \(run.stderr)")
            #expect(run.stderr.contains("cannot reach the database DATABASE_URL names") && run.stderr.contains("port 1"),
                    "\(arguments): \(run.stderr)")
            #expect(!run.stderr.contains("PostgresError") && !run.stderr.contains("{"), "\(arguments): \(run.stderr)")
        }
    }

    /// simulate opens no database; dev makes the Apple credentials: their help does not call
    /// those settings required.
    @Test func helpSaysWhatACommandReallyNeeds() async throws {
        let simulate = try await Siwa.run(["help", "simulate"], environment: [:], timeout: .seconds(30))
        #expect(simulate.status == 0 && !simulate.stdout.contains("DATABASE_URL"), "\(simulate.stdout)")
        let dev = try await Siwa.run(["help", "dev"], environment: [:], timeout: .seconds(30))
        for variable in ["SIWA_TEAM_ID", "SIWA_KEY_ID", "SIWA_PRIVATE_KEY_FILE", "SIWA_TOKEN_KEYS", "DATABASE_URL"] {
            let line = dev.stdout.split(separator: "\n").first { $0.hasPrefix("  \(variable)  [") }
            #expect(line != nil && !line!.contains("required"), "\(variable): \(line ?? "missing")")
        }
    }
}
