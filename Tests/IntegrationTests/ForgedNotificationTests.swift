import CryptoCore
import Foundation
import Postgres
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
                let (receiver, base) = try await ReceiverProcessTests.startReceiver(
                    databaseURL: receiverURL, keys: keys, extra: ["SIWA_LOG_LEVEL": "info"])
                teardown.add { await receiver.stop() }
                let worker = try ServiceProcess(
                    "siwa-worker",
                    environment: [
                        "DATABASE_URL": database.url, "SIWA_CLIENT_IDS": "com.example.app", "SIWA_APPLE_CALLS": "disabled",
                        "SIWA_APPLE_BASE_URL": keys.baseURL, "SIWA_OPS_LISTEN": "127.0.0.1:0", "SIWA_LOG_LEVEL": "info",
                        "SIWA_POLL_INTERVAL": "200ms",
                    ])
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
                let errors = worker.log.split(separator: "\n").filter { $0.contains(#""level":"error""#) && $0.contains("forged") }
                #expect(errors.count == 2, "\(worker.log)")
                let metrics = try await HTTP.request("GET", "http://127.0.0.1:\(opsPort)/metrics").body
                #expect(metrics.contains("siwa_worker_notifications_forged_total 2\n"), "\(metrics)")
            }
        } }
    }
}
