import CryptoCore
import Foundation
import Postgres
import TestTiming
import Testing

/// A compromised receiver: its database login (a member of siwa_receiver) stores notification rows
/// of its own making. None is applied; each is recorded as forged, logged at error and counted,
/// while genuine notifications through the same login are applied as before.
@Suite("Forged notifications")
struct ForgedNotificationTests {
    @Test func rowsTheReceiverRoleForgedAreRecordedAsForgedAndNeverApplied() async throws {
        try await withMigratedDatabase { database in try await database.withReceiverLogin { receiverURL in
            try await withTeardown { teardown in
                let admin = try await database.connect()
                defer { admin.close() }

                let keys = try TestAppleKeys()
                defer { keys.stop() }
                let (receiver, base) = try await ReceiverUnderTest.start(
                    databaseURL: receiverURL, keys: keys, extra: ["SIWA_LOG_LEVEL": "info"])
                teardown.add { await receiver.stop() }
                let worker = try database.startWorker(["SIWA_APPLE_BASE_URL": keys.baseURL])
                teardown.add { await worker.stop() }
                let opsPort = try await worker.boundHTTPPort()

                // Genuine, through the receiver: applied.
                let genuineJTI = "genuine-\(UUID().uuidString)"
                let genuine = TestAppleKeys.body(try keys.sign(TestAppleKeys.claims(sub: "genuine", jti: genuineJTI)))
                #expect(try await HTTP.request("POST", base + "/apple/notifications", body: genuine).status == 200)

                // Forged, straight into the table with the receiver's login: an account-deleted signed
                // by a key that is not Apple's, and a real signed token whose columns were changed.
                let forger = try await PostgresConnection.connect(to: receiverURL, logger: TestDatabase.logger)
                defer { forger.close() }
                let otherKey = try RSA.PrivateKey.generate()
                let badSignature = try keys.sign(TestAppleKeys.claims(type: "account-deleted", sub: "victim-1", jti: "forged-1"), with: otherKey)
                let realToken = try keys.sign(TestAppleKeys.claims(type: "consent-revoked", sub: "someone", jti: "forged-2"))
                for (jti, sub, jws) in [("forged-1", "victim-1", badSignature), ("forged-2", "victim-2", realToken)] {
                    try await forger.execute(
                        """
                        INSERT INTO siwa.notifications (jti, client_id, sub, event_type, event_time, claims, jws)
                        VALUES (\(jti), 'com.example.app', \(sub), 'account-deleted', now(), '{}', \(jws))
                        """)
                }

                try await admin.waitFor(
                    "SELECT count(*) FROM siwa.notifications WHERE processed_at IS NOT NULL", timeout: .seconds(30)
                ) { $0 == 3 }
                let outcomes = try await admin.query("SELECT jti, outcome FROM siwa.notifications ORDER BY jti").map {
                    "\(try $0.decode(String.self, column: "jti")) \(try $0.decode(String.self, column: "outcome"))"
                }
                #expect(outcomes == ["forged-1 forged", "forged-2 forged", "\(genuineJTI) applied"])
                let victims = try await admin.query("SELECT count(*) FROM siwa.accounts WHERE sub LIKE 'victim-%'")[0].decode(Int.self, at: 0)
                #expect(victims == 0, "a forged notification touched an account")
                let jobs = try await admin.query(
                    "SELECT count(*) FROM siwa.jobs WHERE notification_jti LIKE 'forged-%' AND state = 'completed' AND outcome = 'forged'")
                #expect(try jobs[0].decode(Int.self, at: 0) == 2)
                let metrics = try await Self.metrics(port: opsPort, showing: "siwa_worker_notifications_forged_total 2\n")
                #expect(metrics.contains("siwa_worker_notifications_forged_total 2\n"), "\(metrics)")
                let errors = worker.log.split(separator: "\n").filter { $0.contains(#""level":"error""#) && $0.contains("forged") }
                #expect(errors.count == 2, "\(worker.log)")
            }
        } }
    }

    /// A batch that rolls back and runs again (its fast path raised, so the isolated path retries
    /// it) judges its held notifications again: a forged one is logged and counted once, for the
    /// transaction that committed (it was counted twice).
    @Test func aForgedNotificationInABatchThatIsRunAgainIsCountedOnce() async throws {
        try await withMigratedDatabase { database in try await database.withReceiverLogin { receiverURL in
            try await withTeardown { teardown in
                let admin = try await database.connect()
                defer { admin.close() }
                let keys = try TestAppleKeys()
                defer { keys.stop() }
                // An effect that raises, so the batch's fast path fails and the isolated path runs it again.
                try await admin.simpleQuery(
                    """
                    CREATE FUNCTION public.refuse_boom() RETURNS trigger LANGUAGE plpgsql AS $$
                    BEGIN IF NEW.sub = 'boom' THEN RAISE EXCEPTION 'boom'; END IF; RETURN NEW; END $$;
                    CREATE TRIGGER refuse_boom BEFORE INSERT OR UPDATE ON siwa.accounts
                       FOR EACH ROW EXECUTE FUNCTION public.refuse_boom();
                    """)
                _ = try await database.queueNotifications(1, prefix: "boom", sub: "boom", on: admin)
                let forger = try await PostgresConnection.connect(to: receiverURL, logger: TestDatabase.logger)
                defer { forger.close() }
                let forged = try keys.sign(
                    TestAppleKeys.claims(type: "account-deleted", sub: "victim", jti: "forged-1"), with: try RSA.PrivateKey.generate())
                try await forger.execute(
                    """
                    INSERT INTO siwa.notifications (jti, client_id, sub, event_type, event_time, claims, jws)
                    VALUES ('forged-1', 'com.example.app', 'victim', 'account-deleted', now(), '{}', \(forged))
                    """)
                // One loop, started after both are queued: they are in its first batch.
                let worker = try database.startWorker(["SIWA_APPLE_BASE_URL": keys.baseURL, "SIWA_NOTIFICATION_CONNECTIONS": "1"])
                teardown.add { await worker.stop() }
                let opsPort = try await worker.boundHTTPPort()
                try await admin.waitFor(
                    """
                    SELECT count(*) FROM siwa.notifications n JOIN siwa.jobs j ON j.notification_jti = 'boom1'
                     WHERE n.jti = 'forged-1' AND n.outcome = 'forged' AND jsonb_array_length(j.errors) > 0
                    """, timeout: .seconds(30)
                ) { $0 == 1 }
                let metrics = try await Self.metrics(port: opsPort, showing: "siwa_worker_notifications_forged_total 1\n")
                #expect(metrics.contains("siwa_worker_notifications_forged_total 1\n"), "\(metrics)")
                let errors = worker.log.split(separator: "\n").filter { $0.contains(#""level":"error""#) && $0.contains("forged-1") }
                #expect(errors.count == 1, "\(worker.log)")
            }
        } }
    }

    /// The worker's /metrics once it shows `line`, or as it is after a bounded wait: forged
    /// notifications are reported right after their batch commits, so just after the rows show them.
    static func metrics(port: Int, showing line: String) async throws -> String {
        var metrics = ""
        // A wait that runs out returns what was seen: the caller's expectation names the line.
        try? await waitUntil("/metrics shows \(line)", timeout: .seconds(10)) {
            metrics = try await HTTP.request("GET", "http://127.0.0.1:\(port)/metrics").body
            return metrics.contains(line)
        }
        return metrics
    }
}
