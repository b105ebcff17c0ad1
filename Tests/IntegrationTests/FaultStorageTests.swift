import Foundation
import Postgres
import Migrations
import Testing
import TestTiming

/// A real `siwa-receiver` against a real PostgreSQL that cannot store: not migrated, read-only,
/// the grant revoked, the table locked. Each is the database's fault, never the notification's:
/// 503 so Apple retries, `/readyz` 503 meanwhile, the SQLSTATE in a warn-or-above log line, and
/// 200 again once the fault is gone (deploy/README.md, "When the database cannot store").
@Suite("Faults: database refuses to store")
struct FaultStorageTests {
    static func post(_ keys: TestAppleKeys, _ base: String) async throws -> (status: Int, body: String) {
        try await HTTP.request(
            "POST", base + "/apple/notifications", body: TestAppleKeys.body(try keys.sign(TestAppleKeys.claims())))
    }

    /// A log line at warn or above naming `sqlState`.
    static func loggedAtWarnOrAbove(_ receiver: ServiceProcess, sqlState: String) -> Bool {
        receiver.log.split(separator: "\n").contains { line in
            line.contains(#""db.sqlstate":"\#(sqlState)""#)
                && [#""level":"warning""#, #""level":"error""#, #""level":"critical""#].contains { line.contains($0) }
        }
    }

    @Test func unmigratedDatabaseIs503AndNotReadyUntilMigrated() async throws {
        try await withMigratedDatabase(migrated: false) { database in
            try await withTeardown { teardown in
                let keys = try TestAppleKeys()
                defer { keys.stop() }
                let (receiver, base) = try await ReceiverUnderTest.listening(databaseURL: database.url, keys: keys)
                teardown.add { await receiver.stop() }
                try await ReceiverUnderTest.waitForReadiness(base, 503, receiver: receiver)
                let (status, body) = try await Self.post(keys, base)
                #expect(status == 503 && body == #"{"error":"database_unavailable"}"#, "\(status) \(body)")
                // The batch calls siwa.store_notifications: with no schema yet, 3F000 (a table named would be 42P01).
                #expect(Self.loggedAtWarnOrAbove(receiver, sqlState: "3F000"), "\(receiver.log)")
                #expect(try await HTTP.request("GET", base + "/readyz").status == 503)

                let connection = try await database.connect()
                defer { connection.close() }
                try await Migrator(logger: TestDatabase.logger).migrate(connection)
                try await ReceiverUnderTest.waitForReadiness(base, 200, receiver: receiver)
                #expect(try await Self.post(keys, base).status == 200)
            }
        }
    }

    @Test func readOnlyDatabaseIs503AndNotReady() async throws {
        try await withMigratedDatabase { database in
            try await withTeardown { teardown in
                let keys = try TestAppleKeys()
                defer { keys.stop() }
                let (receiver, base) = try await ReceiverUnderTest.listening(databaseURL: database.url, keys: keys)
                teardown.add { await receiver.stop() }
                try await ReceiverUnderTest.waitForReadiness(base, 200, receiver: receiver)
                #expect(try await Self.post(keys, base).status == 200)

                // What a primary demoted to a standby looks like to a session: every write refused (25006).
                let admin = try await database.connect()
                defer { admin.close() }
                try await admin.simpleQuery("ALTER DATABASE \(database.name) SET default_transaction_read_only = on")
                _ = try await admin.query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'siwa-receiver' AND datname = \(database.name)")
                // The first answers may come from the broken session (503 too); post until the
                // reconnected, read-only one has refused a commit.
                var statuses: [Int] = []
                try await waitUntil("the receiver logged 25006 at warn or above", detail: receiver.log) {
                    statuses.append(try await Self.post(keys, base).status)
                    return Self.loggedAtWarnOrAbove(receiver, sqlState: "25006")
                }
                #expect(!statuses.isEmpty && statuses.allSatisfy { $0 == 503 }, "\(statuses)")
                try await ReceiverUnderTest.waitForReadiness(base, 503, receiver: receiver)

                try await admin.simpleQuery("ALTER DATABASE \(database.name) RESET default_transaction_read_only")
                _ = try await admin.query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'siwa-receiver' AND datname = \(database.name)")
                try await ReceiverUnderTest.waitForReadiness(base, 200, receiver: receiver)
                #expect(try await Self.post(keys, base).status == 200)
            }
        }
    }

    @Test func revokedGrantIs503AndNotReady() async throws {
        try await withMigratedDatabase { database in try await database.withReceiverLogin { receiverURL in
            try await withTeardown { teardown in
                let admin = try await database.connect()
                defer { admin.close() }
                let keys = try TestAppleKeys()
                defer { keys.stop() }
                let (receiver, base) = try await ReceiverUnderTest.listening(databaseURL: receiverURL, keys: keys)
                teardown.add { await receiver.stop() }
                try await ReceiverUnderTest.waitForReadiness(base, 200, receiver: receiver)
                #expect(try await Self.post(keys, base).status == 200)

                try await admin.simpleQuery("REVOKE INSERT ON siwa.notifications FROM siwa_receiver")
                let (status, body) = try await Self.post(keys, base)
                #expect(status == 503 && body == #"{"error":"database_unavailable"}"#, "\(status) \(body)")
                #expect(Self.loggedAtWarnOrAbove(receiver, sqlState: "42501"), "\(receiver.log)")
                try await ReceiverUnderTest.waitForReadiness(base, 503, receiver: receiver)

                // Back to what sql/006_hardening.sql grants.
                try await admin.simpleQuery(
                    "GRANT INSERT (jti, client_id, sub, event_type, event_time, email, is_private_email, claims, jws) ON siwa.notifications TO siwa_receiver")
                try await ReceiverUnderTest.waitForReadiness(base, 200, receiver: receiver)
                #expect(try await Self.post(keys, base).status == 200)
            }
        } }
    }

    @Test func lockedTableIsAnswered503WithinTheCommitTimeout() async throws {
        try await withMigratedDatabase { database in
            try await withTeardown { teardown in
                let keys = try TestAppleKeys()
                defer { keys.stop() }
                let (receiver, base) = try await ReceiverUnderTest.listening(
                    databaseURL: database.url, keys: keys, extra: ["SIWA_RECEIVER_COMMIT_TIMEOUT": "1s"])
                teardown.add { await receiver.stop() }
                try await ReceiverUnderTest.waitForReadiness(base, 200, receiver: receiver)

                // Another session holds the table: without a bound every POST hangs until the client
                // gives up (the test's HTTP client waits 15 s, far past the 1 s commit timeout).
                let blocker = try await database.connect()
                defer { blocker.close() }
                try await blocker.simpleQuery("BEGIN; LOCK TABLE siwa.notifications IN ACCESS EXCLUSIVE MODE")
                let answers = try await concurrentMap(Array(0..<4), width: 4) { _ in try await Self.post(keys, base) }
                #expect(answers.allSatisfy { $0.status == 503 }, "\(answers)")
                #expect(
                    answers.allSatisfy { [#"{"error":"database_timeout"}"#, #"{"error":"database_unavailable"}"#].contains($0.body) },
                    "\(answers)")
                try await ReceiverUnderTest.waitForReadiness(base, 503, receiver: receiver)

                try await blocker.simpleQuery("ROLLBACK")
                try await waitUntil("a notification is stored again") { try await Self.post(keys, base).status == 200 }
                try await ReceiverUnderTest.waitForReadiness(base, 200, receiver: receiver)
                #expect(receiver.isRunning)
            }
        }
    }

    @Test func workerStatementsAreBoundedByALockTheyCannotGet() async throws {
        try await withMigratedDatabase { database in
            try await withTeardown { teardown in
                let blocker = try await database.connect()
                defer { blocker.close() }
                try await blocker.simpleQuery("BEGIN; LOCK TABLE siwa.jobs IN ACCESS EXCLUSIVE MODE")
                let worker = try ServiceProcess(
                    "siwa-worker",
                    environment: [
                        "DATABASE_URL": database.url, "SIWA_CLIENT_IDS": "com.example.app", "SIWA_APPLE_CALLS": "disabled",
                        "SIWA_OPS_LISTEN": "127.0.0.1:0", "SIWA_LOG_LEVEL": "info", "SIWA_POLL_INTERVAL": "200ms",
                        "SIWA_WORKER_STATEMENT_TIMEOUT": "1s",
                    ])
                teardown.add { await worker.stop() }
                // Without a bound the claim waits for the lock as long as it is held, and says nothing.
                _ = try await worker.firstLogLine("sqlState 55P03", timeout: .seconds(30)) { $0.contains("sqlState: 55P03") ? true : nil }
                try await blocker.simpleQuery("ROLLBACK")
                #expect(worker.isRunning)
            }
        }
    }
}
