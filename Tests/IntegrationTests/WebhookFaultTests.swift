import Foundation
import LocalPostgres
import Postgres
import TestTiming
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Deliveries across a worker SIGKILLed mid-request and a PostgreSQL restart: nothing lost, order
/// per account kept, and a change answered 2xx sent again only after a crash mid-request.
@Suite("Webhook faults", .serialized)
struct WebhookFaultTests {
    @Test func workerKilledMidDeliveryLosesNothing() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            // The victim's first attempt hangs; nobody will ever read its (non-2xx) answer.
            let sink = try WebhookSink(secret: WebhookDeliveryTests.secret) { request, attempt in
                request.sub == "victim" && attempt == 0 ? WebhookSink.Answer(status: 504, delay: .seconds(3)) : .ok
            }
            defer { sink.stop() }
            let webhookEnvironment = [
                "SIWA_WEBHOOK_URL": sink.url, "SIWA_WEBHOOK_SECRET": WebhookDeliveryTests.secret, "SIWA_RETRY_BASE": "20ms",
            ]
            let first = try database.startWorker(webhookEnvironment)
            try await connection.waitFor("SELECT count(*) FROM siwa.webhook_endpoint", timeout: .seconds(30)) { $0 == 1 }
            try await WebhookDeliveryTests().recordChanges(["victim"], count: 2, tag: "v", on: connection)
            try await WebhookDeliveryTests().recordChanges(["bystander"], count: 5, tag: "b", on: connection)
            let victimIDs = try await WebhookDeliveryTests().changeIDs("victim", on: connection)

            try await sink.waitUntil { _ in sink.arrived.contains { $0.changeID == victimIDs[0] } }
            first.signal(SIGKILL)
            _ = await first.waitForExit(timeout: .seconds(10))
            let second = try database.startWorker(webhookEnvironment)
            try await connection.waitFor(
                "SELECT count(*) FROM siwa.jobs WHERE kind = 'webhook' AND state = 'completed'", timeout: .seconds(30)
            ) { $0 == 7 }
            await second.stop()

            let delivered = sink.firstDeliveries
            #expect(sink.received.allSatisfy { $0.verified })
            #expect(delivered.count == 7)
            #expect(delivered.filter { $0.sub == "victim" }.compactMap(\.changeID) == victimIDs)
            try await WebhookDeliveryTests().expectNoUnexplainedRepeats(sink, on: connection)
            // The change cut off mid-request is sent again under the same webhook-id (what receivers
            // deduplicate on), after the lease of the killed worker ran out.
            let hung = try #require(sink.arrived.first { $0.changeID == victimIDs[0] })
            let redelivered = try #require(delivered.first { $0.changeID == victimIDs[0] })
            #expect(hung.webhookID == redelivered.webhookID)
            #expect(try await connection.int(
                "SELECT attempt FROM siwa.jobs WHERE kind = 'webhook' AND args ->> 'change_id' = \(String(victimIDs[0]))") >= 2)
            #expect(!second.log.contains("\"level\":\"error\""), "\(second.log)")
        }
    }

    /// The whole path in real processes: a stored notification, its effect applied by the worker,
    /// the change row, and its delivery by the same worker.
    @Test func appliedEffectsReachTheWebhook() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            let sink = try WebhookSink(secret: WebhookDeliveryTests.secret)
            defer { sink.stop() }
            let worker = try database.startWorker([
                "SIWA_WEBHOOK_URL": sink.url, "SIWA_WEBHOOK_SECRET": WebhookDeliveryTests.secret,
            ])
            try await connection.waitFor("SELECT count(*) FROM siwa.webhook_endpoint", timeout: .seconds(30)) { $0 == 1 }
            try await database.queueNotifications(4, types: ["consent-revoked", "email-disabled"], on: connection)
            try await sink.waitUntil { $0.filter { $0.status == 200 }.count >= 4 }
            // The counters move once the results are written: read /metrics until they do (bounded).
            let port = try await worker.boundHTTPPort()
            var metrics = ""
            try? await waitUntil("/metrics counts 4 deliveries", timeout: .seconds(15), every: .milliseconds(50)) {
                metrics = try await HTTP.request("GET", "http://127.0.0.1:\(port)/metrics").body
                return metrics.contains("siwa_webhook_delivered_total 4")
            }
            await worker.stop()
            let changes = try await connection.int("SELECT count(*) FROM siwa.account_changes")
            #expect(changes == 4)
            let delivered = sink.firstDeliveries
            #expect(delivered.count == changes)
            #expect(sink.received.allSatisfy { $0.verified })
            #expect(Set(delivered.compactMap { try? JSONSerialization.jsonObject(with: Data($0.body.utf8)) as? [String: Any] }
                .compactMap { $0["change"] as? String }) == ["consent_revoked", "email_disabled"])
            #expect(metrics.contains("siwa_webhook_delivered_total 4"), "\(metrics)")
            #expect(metrics.contains("siwa_webhook_delivery_delay_seconds_count 4"))
        }
    }

    @Test func postgresRestartWithDeliveriesPendingLosesNothing() async throws {
        let cluster = try await LocalPostgresClusterForTest.start()
        do {
            try await restartWithDeliveriesPending(cluster)
        } catch {
            await cluster.destroy()
            throw error
        }
        await cluster.destroy()
    }

    private func restartWithDeliveriesPending(_ cluster: LocalPostgresCluster) async throws {
        var connection = try await PostgresConnection.connect(to: cluster.url, logger: TestDatabase.logger)
        try await SiwaMigrations.apply(connection)
        let sink = try WebhookSink(secret: WebhookDeliveryTests.secret) { _, _ in .status(503) }
        defer { sink.stop() }
        let running = try await RunningDispatcher.start(databaseURL: cluster.url, sink: sink, on: connection)
        try await WebhookDeliveryTests().recordChanges(["p", "q", "r"], count: 3, tag: "x", on: connection)
        try await sink.waitUntil { $0.count >= 3 }

        // Answers turn 2xx but slow: the deliveries in flight are answered while the database is down,
        // and their results must be written once it is back (not lost, not sent twice).
        let flipped = sink.arrived.count
        sink.answer { _, _ in WebhookSink.Answer(status: 200, delay: .seconds(1)) }
        try await sink.waitUntil { _ in sink.arrived.count > flipped }
        connection.close()
        try await cluster.stop()
        try await sink.waitUntil { $0.contains { $0.status == 200 } }
        try await cluster.startAgain()
        sink.answer { _, _ in .ok }

        connection = try await PostgresConnection.connect(to: cluster.url, logger: TestDatabase.logger)
        defer { connection.close() }
        try await connection.waitFor(
            "SELECT count(*) FROM siwa.jobs WHERE kind = 'webhook' AND state = 'completed'", timeout: .seconds(30)
        ) { $0 == 9 }
        await running.stop()

        let delivered = sink.firstDeliveries
        #expect(sink.received.allSatisfy { $0.verified })
        #expect(delivered.count == 9)
        try await WebhookDeliveryTests().expectNoUnexplainedRepeats(sink, on: connection)
        for sub in ["p", "q", "r"] {
            let ids = delivered.filter { $0.sub == sub }.compactMap(\.changeID)
            #expect(ids == (try await WebhookDeliveryTests().changeIDs(sub, on: connection)))
        }
    }
}
