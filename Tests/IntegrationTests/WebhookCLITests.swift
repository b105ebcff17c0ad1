import Foundation
import Postgres
import ScriptedHTTPServer
import Testing

/// `siwa webhooks test|disable`, `siwa status` and `siwa jobs` on deliveries, and the worker's
/// configuration checks, through the built binaries.
@Suite("Webhook CLI", .serialized)
struct WebhookCLITests {
    @Test func webhooksTestSendsASignedEventAndPrintsTheAnswer() async throws {
        let sink = try WebhookSink(secret: WebhookDeliveryTests.secret) { request, _ in
            request.changeID == 0 ? .status(204) : .status(500)
        }
        defer { sink.stop() }
        let environment = ["SIWA_WEBHOOK_URL": sink.url, "SIWA_WEBHOOK_SECRET": WebhookDeliveryTests.secret]
        let run = try await Siwa.run(["webhooks", "test"], environment: environment)
        #expect(run.status == 0, "\(run.stdout)\(run.stderr)")
        #expect(run.stdout.contains("answered 204"))
        let received = try #require(sink.received.first)
        #expect(received.verified)
        #expect(received.webhookID?.hasPrefix("test_") == true)
        #expect(received.body.contains(#""change":"webhook_test""#))
        #expect(!run.stdout.contains(WebhookDeliveryTests.secret.dropFirst(6)), "the secret was printed")

        sink.answer { _, _ in .status(500) }
        let failing = try await Siwa.run(["webhooks", "test"], environment: environment)
        #expect(failing.status == 1)
        #expect(failing.stdout.contains("answered 500"))
        let refusing = try RefusingPort()
        defer { refusing.release() }
        let down = try await Siwa.run(
            ["webhooks", "test"], environment: environment.merging(["SIWA_WEBHOOK_URL": "http://127.0.0.1:\(refusing.port)/x"]) { $1 })
        #expect(down.status == 1)
        #expect(down.stdout.contains("connection failed"))
    }

    /// `siwa webhooks sink` refuses a delivery signed with another secret (401), so `siwa webhooks
    /// test` with the wrong secret fails (exit 1) instead of reporting OK; the right one passes.
    @Test func sinkRefusesABadSignatureAndTestThenFails() async throws {
        let sink = try ServiceProcess(
            "siwa", arguments: ["webhooks", "sink", "--listen", "127.0.0.1:0"],
            environment: ["SIWA_WEBHOOK_SECRET": WebhookDeliveryTests.secret])
        let endpoint = try await sink.firstLogLine("its listening line", timeout: .seconds(30)) {
            DevFlowTests.capture(#"listening on (http://127\.0\.0\.1:[0-9]+/)"#, in: String($0))
        }
        let otherSecret = "whsec_" + Data((0..<32).map { UInt8($0 * 11 % 256) }).base64EncodedString()
        let wrong = try await Siwa.run(
            ["webhooks", "test"], environment: ["SIWA_WEBHOOK_URL": endpoint, "SIWA_WEBHOOK_SECRET": otherSecret])
        #expect(wrong.status == 1, "\(wrong.stdout)")
        #expect(wrong.stdout.contains("answered 401"), "\(wrong.stdout)")
        let right = try await Siwa.run(
            ["webhooks", "test"], environment: ["SIWA_WEBHOOK_URL": endpoint, "SIWA_WEBHOOK_SECRET": WebhookDeliveryTests.secret])
        #expect(right.status == 0 && right.stdout.contains("answered 204"), "\(right.stdout)")
        #expect(sink.log.contains("BAD SIGNATURE") && sink.log.contains(": verified"), "\(sink.log)")
        await sink.stop()
    }

    @Test func badSettingsAreExitTwoNamingTheVariable() async throws {
        let secret = WebhookDeliveryTests.secret
        for (environment, variable) in [
            (["SIWA_WEBHOOK_URL": "http://example.com/hook", "SIWA_WEBHOOK_SECRET": secret], "SIWA_WEBHOOK_URL"),
            (["SIWA_WEBHOOK_URL": "https://example.com/hook"], "SIWA_WEBHOOK_SECRET"),
            (["SIWA_WEBHOOK_URL": "https://example.com/hook", "SIWA_WEBHOOK_SECRET": "whsec_dG9vc2hvcnQ="], "SIWA_WEBHOOK_SECRET"),
        ] {
            let worker = try await Siwa.run(
                [], environment: environment.merging([
                    "DATABASE_URL": "postgresql://127.0.0.1:1/none", "SIWA_CLIENT_IDS": "com.example.app",
                    "SIWA_APPLE_CALLS": "disabled",
                ]) { $1 }, executable: "siwa-worker")
            #expect(worker.status == 2)
            #expect(worker.stderr.hasPrefix("siwa-worker: \(variable):"), "\(worker.stderr)")
            #expect(!worker.stderr.contains("dG9vc2hvcnQ"))
            let test = try await Siwa.run(["webhooks", "test"], environment: environment)
            #expect(test.status == 2)
            #expect(test.stderr.contains(variable))
        }
    }

    @Test func statusJobsAndDisable() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            let sink = try WebhookSink(secret: WebhookDeliveryTests.secret) { _, _ in .status(500) }
            defer { sink.stop() }
            let running = try await RunningDispatcher.start(database, sink: sink, window: .milliseconds(300), on: connection)
            try await WebhookDeliveryTests().recordChanges(["held"], count: 3, tag: "h", on: connection)
            try await WebhookDeliveryTests().recordChanges(["retried"], count: 1, tag: "r", on: connection)
            try await connection.waitFor(
                "SELECT count(*) FROM siwa.jobs WHERE kind = 'webhook' AND state = 'discarded'", timeout: .seconds(60)) { $0 == 2 }
            await running.stop()

            let json = try await Siwa.run(["status", "--json"], environment: ["DATABASE_URL": database.url])
            #expect(json.status == 0, "\(json.stderr)")
            let object = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any])
            let webhooks = try #require(object["webhooks"] as? [String: Any])
            #expect(webhooks["endpoint"] as? String == sink.url)
            #expect(webhooks["discarded"] as? Int == 2)
            #expect(webhooks["blocked_by_discarded"] as? Int == 2)
            #expect(webhooks["undelivered"] as? Int == 2)
            #expect((webhooks["oldest_undelivered_seconds"] as? Double ?? -1) >= 0)

            let text = try await Siwa.run(["status"], environment: ["DATABASE_URL": database.url])
            #expect(text.stdout.contains("webhooks             \(sink.url)"), "\(text.stdout)")
            #expect(text.stdout.contains("webhook backlog      2 undelivered"), "\(text.stdout)")
            #expect(text.stdout.contains("2 discarded, holding back 2 later changes"), "\(text.stdout)")

            let list = try await Siwa.run(
                ["jobs", "list", "--kind", "webhook", "--state", "discarded"], environment: ["DATABASE_URL": database.url])
            #expect(list.status == 0, "\(list.stderr)")
            #expect(list.stdout.contains("answered 500"))

            let disable = try await Siwa.run(["webhooks", "disable"], environment: ["DATABASE_URL": database.url])
            #expect(disable.status == 0, "\(disable.stderr)")
            #expect(disable.stdout.contains("cancelled 4 queued deliveries"), "\(disable.stdout)")
            let off = try await Siwa.run(["status"], environment: ["DATABASE_URL": database.url])
            #expect(off.stdout.contains("webhooks             off"), "\(off.stdout)")
            try await WebhookDeliveryTests().recordChanges(["after"], count: 1, tag: "a", on: connection)
            #expect(try await connection.int("SELECT count(*) FROM siwa.jobs WHERE kind = 'webhook' AND state <> 'cancelled'") == 0)
        }
    }
}
