import Foundation
import HTTPServer
import Postgres
import TestTiming
import Testing

/// The built `siwa` binary, run as an operator would, against real migrated databases.
@Suite(.serialized) struct CLITests {
    // MARK: migrate

    @Test func migrateTwiceThenTwoAtOnce() async throws {
        try await withEmptyDatabase { url in
            for _ in 0..<2 {
                let run = try await Siwa.run(["migrate"], environment: ["DATABASE_URL": url])
                #expect(run.status == 0, "\(run.stderr)")
            }
            try await expectEachVersionOnce(url)
        }
        try await withEmptyDatabase { url in
            async let first = Siwa.run(["migrate"], environment: ["DATABASE_URL": url])
            async let second = Siwa.run(["migrate", "--database-url", url], environment: [:])
            let runs = try await [first, second]
            for run in runs { #expect(run.status == 0, "\(run.stderr)") }
            try await expectEachVersionOnce(url)
        }
    }

    private func expectEachVersionOnce(_ url: String) async throws {
        let connection = try await PostgresConnection.connect(to: url, logger: TestDatabase.logger)
        defer { connection.close() }
        let rows = try await connection.query(
            "SELECT count(*) AS total, count(DISTINCT version) AS distinct_versions FROM siwa.schema_migrations")
        let total = try rows[0].decode(Int.self, column: "total")
        #expect(total >= 3)
        #expect(total == (try rows[0].decode(Int.self, column: "distinct_versions")))
    }

    // MARK: status

    @Test func statusJSONCountsJobsByState() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            try await connection.simpleQuery(
                """
                INSERT INTO siwa.jobs (kind, state, client_id, sub) VALUES
                  ('notification', 'available', 'com.example.app', 's1'),
                  ('notification', 'available', 'com.example.app', 's2'),
                  ('notification', 'completed', 'com.example.app', 's3'),
                  ('exchange', 'discarded', 'com.example.app', 's4');
                INSERT INTO siwa.rejections VALUES (date_trunc('minute', now()), 'bad_signature', 2);
                SELECT siwa.request_deletion('com.example.app', 's5');
                """)
            let run = try await Siwa.run(["status", "--json"], environment: ["DATABASE_URL": database.url])
            #expect(run.status == 0, "\(run.stderr)")
            let object = try #require(try JSONSerialization.jsonObject(with: Data(run.stdout.utf8)) as? [String: Any])
            let jobs = try #require(object["jobs"] as? [String: Any])
            let byState = try #require(jobs["by_state"] as? [String: Int])
            #expect(byState == ["available": 3, "running": 0, "completed": 1, "discarded": 1, "cancelled": 0])
            #expect(jobs["discarded"] as? Int == 1)
            #expect(jobs["ready"] as? Int == 3)
            let byKind = try #require(jobs["by_kind"] as? [String: [String: Int]])
            #expect(byKind["revoke"]?["available"] == 1)
            let deletions = try #require(object["pending_deletions"] as? [String: Any])
            #expect(deletions["count"] as? Int == 1)
            let lastHour = try #require(object["last_hour"] as? [String: Any])
            #expect(lastHour["rejected"] as? Int == 2)

            let text = try await Siwa.run(["status"], environment: ["DATABASE_URL": database.url])
            #expect(text.status == 0)
            #expect(text.stdout.contains("pending deletions"))
        }
    }

    /// An app transaction that wrote a change and stays open holds the change feed back; status
    /// names it, and stops once it ends.
    @Test func statusNamesATransactionHoldingTheChangeFeedBack() async throws {
        try await withMigratedDatabase { database in
            let app = try await database.connect()
            defer { app.close() }
            let quiet = try await Siwa.run(["status", "--json"], environment: ["DATABASE_URL": database.url])
            let quietFeed = try #require((try JSONSerialization.jsonObject(with: Data(quiet.stdout.utf8)) as? [String: Any])?["change_feed"] as? [String: Any])
            #expect(quietFeed["held_back_by_pid"] is NSNull, "\(quiet.stdout)")

            try await app.simpleQuery("SET application_name = 'slow-app'; BEGIN; SELECT siwa.request_deletion('com.example.app', 's1')")
            let pid = try await app.query("SELECT pg_backend_pid()")[0].decode(Int32.self, at: 0)
            // Named once it has been open longer than the feed waits (1 s).
            var feed: [String: Any] = [:]
            try await waitUntil("siwa status names the transaction holding the feed back", timeout: .seconds(60), every: .zero, detail: "\(feed)") {
                let run = try await Siwa.run(["status", "--json"], environment: ["DATABASE_URL": database.url])
                #expect(run.status == 0, "\(run.stderr)")
                feed = (try JSONSerialization.jsonObject(with: Data(run.stdout.utf8)) as? [String: Any])?["change_feed"] as? [String: Any] ?? [:]
                return feed["held_back_by_pid"] as? Int != nil
            }
            #expect(feed["held_back_by_pid"] as? Int == Int(pid))
            #expect((feed["held_back_seconds"] as? Double ?? 0) >= 1)
            let text = try await Siwa.run(["status"], environment: ["DATABASE_URL": database.url])
            #expect(text.stdout.contains("held back by a transaction writing changes") && text.stdout.contains("pid \(pid)")
                && text.stdout.contains("application \"slow-app\""), "\(text.stdout)")

            // A login that may not see other logins' sessions (no pg_read_all_stats) still learns
            // of it: the same transaction is open a second later.
            try await database.withLogin(inRole: "siwa_worker") { url in
                let limited = try await Siwa.run(["status", "--json"], environment: ["DATABASE_URL": url])
                #expect(limited.status == 0, "\(limited.stderr)")
                let seen = (try JSONSerialization.jsonObject(with: Data(limited.stdout.utf8)) as? [String: Any])?["change_feed"] as? [String: Any]
                #expect(seen?["held_back_by_pid"] as? Int == Int(pid) && seen?["held_back_seconds"] is NSNull, "\(limited.stdout)")
                let text = try await Siwa.run(["status"], environment: ["DATABASE_URL": url])
                #expect(text.stdout.contains("when it began is hidden from this login"), "\(text.stdout)")
            }

            try await app.simpleQuery("COMMIT")
            let after = try await Siwa.run(["status"], environment: ["DATABASE_URL": database.url])
            #expect(after.stdout.contains("not held back"), "\(after.stdout)")
        }
    }

    @Test func statusExitsOneWhenTheDatabaseIsUnreachable() async throws {
        let run = try await Siwa.run(
            ["status"], environment: ["DATABASE_URL": "postgresql://postgres@127.0.0.1:1/none?connect_timeout=2"])
        #expect(run.status == 1)
        #expect(run.stderr.split(separator: "\n").count == 1, "\(run.stderr)")
    }

    @Test func badDatabaseURLExitsTwoNamingTheVariable() async throws {
        for command in [["migrate"], ["status"], ["jobs", "list"]] {
            let run = try await Siwa.run(command, environment: ["DATABASE_URL": "not a url"])
            #expect(run.status == 2, "\(command)")
            let lines = run.stderr.split(separator: "\n")
            #expect(lines.count == 1, "\(run.stderr)")
            #expect(run.stderr.contains("DATABASE_URL"))
        }
    }

    // MARK: jobs

    @Test func retryMakesADiscardedJobAvailable() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            let id = try await connection.query(
                """
                INSERT INTO siwa.jobs (kind, state, client_id, sub, attempt, max_attempts, errors, finalized_at,
                                       run_at)
                SELECT 'exchange', 'discarded', 'com.example.app', 's1', 8, 8,
                       (SELECT jsonb_agg(jsonb_build_object('error', 'invalid_grant')) FROM generate_series(1, 8)),
                       now(), now() - interval '1 day'
                RETURNING id
                """)[0].decode(Int64.self, column: "id")
            let run = try await Siwa.run(["jobs", "retry", String(id)], environment: ["DATABASE_URL": database.url])
            #expect(run.status == 0, "\(run.stderr)")
            #expect(run.stdout.contains("retried 1 job"))
            let row = try await connection.query(
                """
                SELECT state, jsonb_array_length(errors) AS errors, run_at > now() - interval '1 minute' AS now,
                       max_attempts > jsonb_array_length(errors) AS can_run
                  FROM siwa.jobs WHERE id = \(id)
                """)[0]
            #expect(try row.decode(String.self, column: "state") == "available")
            #expect(try row.decode(Int.self, column: "errors") == 8)  // history kept
            #expect(try row.decode(Bool.self, column: "now"))
            #expect(try row.decode(Bool.self, column: "can_run"))

            let again = try await Siwa.run(["jobs", "retry", String(id)], environment: ["DATABASE_URL": database.url])
            #expect(again.status == 0)
            #expect(again.stdout.contains("retried 1 job"))  // available with errors: brought forward
            let list = try await Siwa.run(
                ["jobs", "list", "--state", "available", "--json"], environment: ["DATABASE_URL": database.url])
            let rows = try #require(try JSONSerialization.jsonObject(with: Data(list.stdout.utf8)) as? [[String: Any]])
            #expect(rows.map { $0["id"] as? Int } == [Int(id)])
        }
    }

    @Test func cancelRefusesAPendingDeletionsRevokeWithoutForce() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            let id = try await connection.query("SELECT siwa.request_deletion('com.example.app', 's9') AS id")[0]
                .decode(Int64.self, column: "id")
            let environment = ["DATABASE_URL": database.url]

            let refused = try await Siwa.run(["jobs", "cancel", String(id)], environment: environment)
            #expect(refused.status == 1)
            #expect(refused.stderr.contains("--force"))
            #expect(try await state(of: id, connection) == "available")
            let bySub = try await Siwa.run(["jobs", "cancel", "--sub", "s9"], environment: environment)
            #expect(bySub.status == 1)
            #expect(try await state(of: id, connection) == "available")

            let forced = try await Siwa.run(["jobs", "cancel", String(id), "--force"], environment: environment)
            #expect(forced.status == 0, "\(forced.stderr)")
            #expect(forced.stderr.contains("warning"))
            #expect(try await state(of: id, connection) == "cancelled")
            let changes = try await connection.query(
                "SELECT count(*) AS n FROM siwa.account_changes WHERE sub = 's9' AND change = 'deletion_revoke_cancelled'")
            #expect(try changes[0].decode(Int.self, column: "n") == 1)
            let status = try await connection.query("SELECT status FROM siwa.accounts WHERE sub = 's9'")
            #expect(try status[0].decode(String.self, column: "status") == "pending_deletion")
        }
    }

    @Test func cancelStopsAnOrdinaryJob() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            let id = try await connection.query(
                "INSERT INTO siwa.jobs (kind, client_id, sub) VALUES ('notification', 'c', 's') RETURNING id")[0]
                .decode(Int64.self, column: "id")
            let run = try await Siwa.run(["jobs", "cancel", String(id)], environment: ["DATABASE_URL": database.url])
            #expect(run.status == 0, "\(run.stderr)")
            #expect(try await state(of: id, connection) == "cancelled")
        }
    }

    /// `--sub SUB --kind K` acts on that kind only (the user's webhook deliveries stay queued), and
    /// each job acted on is printed with its kind.
    @Test func cancelBySubNarrowsToAKindAndPrintsKinds() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            let ids = try await connection.query(
                """
                INSERT INTO siwa.jobs (kind, client_id, sub) VALUES
                  ('notification', 'c', 'kinds'), ('webhook', 'c', 'kinds') RETURNING id
                """).map { try $0.decode(Int64.self, column: "id") }
            let environment = ["DATABASE_URL": database.url]
            let run = try await Siwa.run(["jobs", "cancel", "--sub", "kinds", "--kind", "notification"], environment: environment)
            #expect(run.status == 0, "\(run.stderr)")
            #expect(run.stdout.contains("cancelled 1 job") && run.stdout.contains("#\(ids[0]) notification"), "\(run.stdout)")
            #expect(try await state(of: ids[0], connection) == "cancelled")
            #expect(try await state(of: ids[1], connection) == "available", "the webhook delivery is left alone")
            let bad = try await Siwa.run(["jobs", "cancel", "--sub", "kinds", "--kind", "nope"], environment: environment)
            #expect(bad.status == 2 && bad.stderr.contains("--kind"), "\(bad.stderr)")
        }
    }

    private func state(of id: Int64, _ connection: PostgresConnection) async throws -> String {
        try await connection.query("SELECT state FROM siwa.jobs WHERE id = \(id)")[0].decode(String.self, column: "state")
    }

    // MARK: dev

    /// `siwa dev --once` against the test database: starts the receiver (and worker and fake Apple
    /// when this build has them), waits for readiness, prints the URLs and stops cleanly.
    @Test func devOnceStartsAndStopsCleanly() async throws {
        try await withMigratedDatabase { database in
            // The receiver and worker take 8080/9090, or free ports when those are busy.
            var arguments = ["dev", "--once"]
            var environment = ["DATABASE_URL": database.url]
            var jwks: HTTPServer?
            if !(try await Siwa.hasFakeApple()) {
                // Until `siwa fake-apple` is merged: serve a key set ourselves so the receiver gets ready.
                let server = try Self.startJWKSServer()
                jwks = server
                environment["SIWA_APPLE_BASE_URL"] = "http://127.0.0.1:\(server.port)"
            }
            defer { jwks?.stop() }
            if try await Siwa.workerIsPlaceholder() { arguments.append("--no-worker") }

            let run = try await Siwa.run(arguments, environment: environment, timeout: .seconds(120))
            #expect(run.status == 0, "stdout:\n\(run.stdout)\nstderr:\n\(run.stderr)")
            #expect(run.stdout.contains("POST http://127.0.0.1:"))
            #expect(run.stdout.contains("/metrics"))
            #expect(run.stdout.contains("DATABASE_URL"))
            #expect(run.stdout.contains("[receiver]"))
            #expect(run.stdout.contains("receiver stopped (status 0)"))
        }
    }

    /// One RSA public key (2048-bit, RS256), enough for the receiver's `/readyz`.
    static func startJWKSServer() throws -> HTTPServer {
        let body = #"{"keys":[{"kty":"RSA","kid":"cli-test","use":"sig","alg":"RS256","n":"\#(Self.modulus)","e":"AQAB"}]}"#
        let server = HTTPServer(configuration: .init(host: "127.0.0.1", port: 0, threadCount: 1)) { request in
            request.path == "/auth/keys" ? .json(body) : .empty(status: 404)
        }
        try server.start()
        return server
    }

    static let modulus =
        "1Ed6IhzVlXNWY_egNfl_vBJGgUvmY50mvoc91o6Xdu83o6hIr-qaV-OK7MfXNqf5sOFHOEEvPsFJvEqNVgFTrB0UQE7nR0BoYvsBJMtdWVcYDO7rnDJT3cKfjEwmVPSnQGSLeT0Fq2-ct2jDsLYW6en8ZEZreenZ0-5Mz-Hd6nM5_2CKXnka8Xq3ksX-W58j8OTQXHF3d-LSfVwi20Urtjb996Sn52qvElu9Gdv4iDlof-TF8bXwL-brtv_1GVqtM3VAwDdkjxlkyQxxK5DEHKGDwhWvRwYTJDDzl8U053EtnIwskMDin9d4IzUDMou-6FYgvxr_mELR3-oYd9Km-w"
}

/// Runs the `siwa` executable built next to the tests.
enum Siwa {
    struct Run: Sendable {
        var status: Int32
        var stdout: String
        var stderr: String
    }

    /// `<repo>/.build/debug/siwa` (or the build folder holding this test bundle).
    static func binary(_ name: String = "siwa") throws -> URL { try ServiceProcess.executable(name) }

    /// Runs with only `environment` (plus PATH and HOME), at most `timeout`.
    static func run(
        _ arguments: [String], environment: [String: String], executable: String = "siwa",
        timeout: Duration = .seconds(60)
    ) async throws -> Run {
        // A full path runs a system tool (curl) the same way.
        let path = executable.hasPrefix("/") ? executable : try binary(executable).path
        let outcome = try await ProgramRun.run(
            path, arguments, environment: ServiceProcess.childEnvironment(environment), timeout: timeout)
        return Run(status: outcome.status, stdout: outcome.stdout, stderr: outcome.stderr)
    }

    /// Whether this build's `siwa` has the `fake-apple` command (another branch adds it).
    static func hasFakeApple() async throws -> Bool {
        try await run(["help"], environment: [:]).stderr.contains("fake-apple")
    }

    /// The worker is still the placeholder that prints "not yet" (another branch builds it).
    static func workerIsPlaceholder() async throws -> Bool {
        let run = try await run([], environment: [:], executable: "siwa-worker", timeout: .seconds(10))
        return run.status == 0 && run.stdout.contains("not yet")
    }
}

/// A database with nothing in it (not migrated), dropped afterwards.
func withEmptyDatabase(_ body: (String) async throws -> Void) async throws {
    let base = try await TestDatabase.shared.baseURL()
    let name = "test_" + String(UInt64.random(in: 0...UInt64.max), radix: 36)
    let admin = try await PostgresConnection.connect(to: base, logger: TestDatabase.logger)
    defer { admin.close() }
    try await admin.simpleQuery("CREATE DATABASE \(name)")
    do {
        try await body(MigratedDatabase.url(base, database: name))
    } catch {
        try? await admin.simpleQuery("DROP DATABASE IF EXISTS \(name) WITH (FORCE)")
        throw error
    }
    try await admin.simpleQuery("DROP DATABASE IF EXISTS \(name) WITH (FORCE)")
}
