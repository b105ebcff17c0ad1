import Foundation
import JobQueue
import Logging
import Postgres
import ScriptedHTTPServer
import Testing
import Webhooks
import Metrics
import TestTiming

/// Webhook deliveries by a real `WebhookDispatcher` against a real PostgreSQL and a local sink that
/// checks every signature with a verifier of its own.
@Suite("Webhook deliveries", .serialized)
struct WebhookDeliveryTests {
    static let secret = "whsec_" + Data((0..<32).map { UInt8($0 * 7 % 256) }).base64EncodedString()

    @Test func sinkVerifierAcceptsThePublishedVectorAndNothingElse() {
        let body = Array(#"{"test": 2432232314}"#.utf8)
        func verify(_ signatures: String, body: [UInt8] = body, now: Int64 = 1_614_265_330) -> Bool {
            IndependentWebhookVerifier.verify(
                secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", id: "msg_p5jXN8AQM9LWM0D4loKWxJek",
                timestamp: "1614265330", body: body, signatures: signatures, now: now)
        }
        #expect(verify("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="))
        #expect(verify("v1,bm9wZQ== v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="))
        #expect(!verify("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", body: body + [0x20]))
        #expect(!verify("v2,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="))
        #expect(!verify("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", now: 1_614_265_330 + 301))
    }

    @Test func deliversEveryChangeSignedOnceInOrderPerAccount() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            let sink = try WebhookSink(secret: Self.secret)
            defer { sink.stop() }
            let running = try await RunningDispatcher.start(database, sink: sink, on: connection)
            for round in 0..<3 {
                // Several accounts per statement, several statements: 3 accounts x 12 changes.
                try await recordChanges(["alice", "bob", "carol"], count: 4, tag: "r\(round)", on: connection)
            }
            try await sink.waitUntil(timeout: .seconds(120)) { _ in sink.firstDeliveries.count >= 36 }
            await running.stop()

            let delivered = sink.firstDeliveries
            #expect(delivered.count == 36)
            #expect(sink.received.allSatisfy { $0.verified })
            #expect(delivered.allSatisfy { $0.webhookID == $0.changeID.map(String.init) })
            try await expectNoUnexplainedRepeats(sink, on: connection)
            for sub in ["alice", "bob", "carol"] {
                let ids = delivered.filter { $0.sub == sub }.compactMap(\.changeID)
                #expect(ids == ids.sorted(), "\(sub) out of order: \(ids)")
                #expect(ids.count == 12)
            }
            // The body is the change object of /v1/changes, keys in the contract's order.
            let first = try #require(delivered.first)
            #expect(first.body.hasPrefix(#"{"id":"#) && first.body.contains(#","client_id":"com.example.app","sub":"#))
            let object = try #require(try JSONSerialization.jsonObject(with: Data(first.body.utf8)) as? [String: Any])
            #expect(Set(object.keys) == ["id", "client_id", "sub", "app_user_id", "change", "status", "reason", "created_at"])
            #expect((object["created_at"] as? String)?.hasSuffix("Z") == true)
            #expect(try await connection.int("SELECT count(*) FROM siwa.jobs WHERE kind = 'webhook' AND state <> 'completed'") == 0)
            #expect(running.registry.render().contains("siwa_webhook_delivered_total 36"))
            _ = running
        }
    }

    @Test func twoDispatchersKeepEachAccountsOrder() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            // Some answers fail, so accounts' heads move at different paces across both dispatchers.
            let sink = try WebhookSink(secret: Self.secret) { request, attempt in
                (request.changeID ?? 0) % 7 == 0 && attempt == 0 ? .status(500) : .ok
            }
            defer { sink.stop() }
            let first = try await RunningDispatcher.start(database, sink: sink, on: connection)
            let second = try await RunningDispatcher.start(database, sink: sink, on: connection)
            let subs = (0..<10).map { "account-\($0)" }
            for round in 0..<3 { try await recordChanges(subs, count: 4, tag: "r\(round)", on: connection) }
            try await connection.waitFor(
                "SELECT count(*) FROM siwa.jobs WHERE kind = 'webhook' AND state = 'completed'", timeout: .seconds(120)
            ) { $0 == 120 }
            await first.stop()
            await second.stop()

            #expect(sink.firstDeliveries.count == 120)
            #expect(sink.received.allSatisfy { $0.verified })
            try await expectNoUnexplainedRepeats(sink, on: connection)
            for sub in subs {
                let ids = try await changeIDs(sub, on: connection)
                #expect(sink.firstDeliveries.filter { $0.sub == sub }.compactMap(\.changeID) == ids)
                // Never sent before the previous change was answered 2xx, whichever dispatcher sent it.
                for (earlier, later) in zip(ids, ids.dropFirst()) {
                    let answered = try #require(sink.delivered.first { $0.changeID == earlier }).answeredAt
                    let firstSent = try #require(sink.arrived.first { $0.changeID == later }).arrivedAt
                    #expect(answered < firstSent, "\(sub): change \(later) sent before \(earlier) was answered")
                }
            }
        }
    }

    @Test func noEndpointNoJobsThenEveryChangeFromRegistrationOn() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            try await recordChanges(["before"], count: 3, tag: "x", on: connection)
            #expect(try await connection.int("SELECT count(*) FROM siwa.jobs WHERE kind = 'webhook'") == 0)

            let sink = try WebhookSink(secret: Self.secret)
            defer { sink.stop() }
            let running = try await RunningDispatcher.start(database, sink: sink, on: connection)
            try await recordChanges(["after"], count: 3, tag: "y", on: connection)
            try await sink.waitUntil { $0.count >= 3 }
            #expect(sink.delivered.map(\.sub) == ["after", "after", "after"])

            // Disabled: queued deliveries are cancelled (kept), new changes queue nothing.
            let cancelled = try await WebhookQueue.disable(on: connection)
            #expect(cancelled == 0)
            try await recordChanges(["later"], count: 2, tag: "z", on: connection)
            #expect(try await connection.int("SELECT count(*) FROM siwa.jobs WHERE kind = 'webhook'") == 3)
            await running.stop()
        }
    }

    @Test func orderKeptForAFailingAccountWhileAnotherFlows() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            let sink = try WebhookSink(secret: Self.secret) { request, _ in request.sub == "stuck" ? .status(500) : .ok }
            defer { sink.stop() }
            let running = try await RunningDispatcher.start(database, sink: sink, on: connection)
            try await recordChanges(["stuck"], count: 3, tag: "s", on: connection)
            try await recordChanges(["flowing"], count: 10, tag: "f", on: connection)
            let stuckIDs = try await changeIDs("stuck", on: connection)

            // The other account is delivered in full while the failing one is retried.
            try await sink.waitUntil { received in
                received.filter { $0.sub == "flowing" && $0.status == 200 }.count == 10
                    && received.filter { $0.sub == "stuck" }.count >= 3
            }
            #expect(sink.received.filter { $0.sub == "stuck" }.allSatisfy { $0.changeID == stuckIDs[0] })
            let errors = try await connection.query(
                "SELECT errors::text AS e FROM siwa.jobs WHERE kind = 'webhook' AND args ->> 'change_id' = \(String(stuckIDs[0]))")
            #expect(try errors[0].decode(String.self, column: "e").contains("answered 500"))
            // The gauges an alert watches (deploy/README.md, "What to alert on") see the stuck account's backlog.
            try await running.waitForGauge("siwa_webhook_undelivered") { $0 == 3 }
            try await running.waitForGauge("siwa_webhook_oldest_undelivered_seconds") { $0 > 0 }

            sink.answer { _, _ in .ok }
            try await sink.waitUntil { $0.filter { $0.sub == "stuck" && $0.status == 200 }.count == 3 }
            try await running.waitForGauge("siwa_webhook_undelivered") { $0 == 0 }
            try await running.waitForGauge("siwa_webhook_oldest_undelivered_seconds") { $0 == 0 }
            await running.stop()

            let stuck = sink.received.filter { $0.sub == "stuck" }
            #expect(sink.firstDeliveries.filter { $0.sub == "stuck" }.compactMap(\.changeID) == stuckIDs)
            try await expectNoUnexplainedRepeats(sink, on: connection)
            // No later change was even sent before the earlier one was answered 2xx.
            for (earlier, later) in zip(stuckIDs, stuckIDs.dropFirst()) {
                let firstLater = try #require(stuck.firstIndex { $0.changeID == later })
                let earlierDelivered = try #require(stuck.firstIndex { $0.changeID == earlier && $0.status == 200 })
                #expect(earlierDelivered < firstLater)
            }
            #expect(sink.received.allSatisfy { $0.verified })
            #expect(running.registry.render().contains(#"siwa_webhook_failures_total{reason="server_error"}"#))
        }
    }

    @Test func slowPastTheTimeoutIsRetriedAndHoldsOnlyItsAccount() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            // The slow account's first attempt gets no answer until the test opens the gate.
            let sink = try WebhookSink(secret: Self.secret) { request, attempt in
                request.sub == "slow" && attempt == 0 ? WebhookSink.Answer(status: 200, held: true) : .ok
            }
            defer { sink.stop() }
            let running = try await RunningDispatcher.start(database, sink: sink, timeout: .seconds(1), on: connection)
            try await recordChanges(["slow"], count: 2, tag: "s", on: connection)
            try await recordChanges(["quick"], count: 5, tag: "q", on: connection)
            let slowIDs = try await changeIDs("slow", on: connection)

            // Every change of the other account is delivered while the slow one's first attempt hangs.
            try await sink.waitUntil { received in received.filter { $0.sub == "quick" && $0.status == 200 }.count == 5 }
            let heldAttempt = try #require(sink.arrived.first { $0.changeID == slowIDs[0] })
            #expect(!sink.received.contains { $0.arrivedAt == heldAttempt.arrivedAt }, "the held attempt was answered")
            // The slow change is retried after the client gave up (1 s) and delivered, then its successor.
            try await connection.waitFor(
                "SELECT count(*) FROM siwa.jobs WHERE kind = 'webhook' AND state = 'completed' AND sub = 'slow'",
                timeout: .seconds(60)) { $0 == 2 }
            sink.openGate()
            await running.stop()

            let job = try await connection.query(
                "SELECT errors::text AS e, attempt FROM siwa.jobs WHERE kind = 'webhook' AND args ->> 'change_id' = \(String(slowIDs[0]))")[0]
            #expect(try job.decode(String.self, column: "e").contains("no answer within the timeout"))
            #expect(try job.decode(Int.self, column: "attempt") >= 2)
            #expect(sink.firstDeliveries.filter { $0.sub == "slow" }.compactMap(\.changeID) == slowIDs)
            #expect(running.registry.render().contains(#"siwa_webhook_failures_total{reason="timeout"}"#))
        }
    }

    @Test func redirectIsAnsweredNotFollowed() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            let sink = try WebhookSink(secret: Self.secret) { request, attempt in
                attempt == 0 && request.path == "/hooks/siwa"
                    ? WebhookSink.Answer(status: 302, headers: [("Location", "/elsewhere")]) : .ok
            }
            defer { sink.stop() }
            let running = try await RunningDispatcher.start(database, sink: sink, on: connection)
            try await recordChanges(["moved"], count: 1, tag: "m", on: connection)
            try await connection.waitFor(
                "SELECT count(*) FROM siwa.jobs WHERE kind = 'webhook' AND state = 'completed'") { $0 == 1 }
            await running.stop()
            #expect(sink.received.map(\.path) == ["/hooks/siwa", "/hooks/siwa"])
            #expect(sink.received.map(\.status) == [302, 200])
            let errors = try await connection.query("SELECT errors::text AS e FROM siwa.jobs WHERE kind = 'webhook'")[0]
            #expect(try errors.decode(String.self, column: "e").contains("answered 302 (redirects are not followed"))
            #expect(running.registry.render().contains(#"siwa_webhook_failures_total{reason="redirect"} 1"#))
        }
    }

    @Test func sinkDownThenUpIsDelivered() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            let refusing = try RefusingPort()
            let url = "http://127.0.0.1:\(refusing.port)/hooks/siwa"
            let running = try await RunningDispatcher.start(database, url: url, on: connection)
            try await recordChanges(["waiting"], count: 2, tag: "w", on: connection)
            try await connection.waitFor(
                "SELECT coalesce(max(jsonb_array_length(errors)), 0) FROM siwa.jobs WHERE kind = 'webhook'") { $0 >= 2 }
            let errors = try await connection.query(
                "SELECT errors::text AS e FROM siwa.jobs WHERE kind = 'webhook' ORDER BY id LIMIT 1")[0]
            #expect(try errors.decode(String.self, column: "e").contains("connection failed"))

            let sink = try WebhookSink(secret: Self.secret, port: refusing.port)
            defer { sink.stop() }
            refusing.release()
            try await sink.waitUntil { $0.filter { $0.status == 200 }.count == 2 }
            await running.stop()
            #expect(sink.firstDeliveries.compactMap(\.changeID) == (try await changeIDs("waiting", on: connection)))
            #expect(running.registry.render().contains(#"siwa_webhook_failures_total{reason="connection"}"#))
        }
    }

    @Test func discardedAfterTheWindowIsKeptHoldsItsAccountAndRunsAgainOnRetry() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            let sink = try WebhookSink(secret: Self.secret) { _, _ in .status(503) }
            defer { sink.stop() }
            let running = try await RunningDispatcher.start(database, sink: sink, window: .seconds(1), on: connection)
            try await recordChanges(["gone"], count: 2, tag: "g", on: connection)
            let ids = try await changeIDs("gone", on: connection)
            try await connection.waitFor(
                "SELECT count(*) FROM siwa.jobs WHERE kind = 'webhook' AND state = 'discarded'") { $0 == 1 }
            let backlog = try await WebhookQueue.backlog(on: connection)
            #expect(backlog.discarded == 1)
            #expect(backlog.blockedByDiscarded == 1)
            #expect(backlog.undelivered == 1)
            #expect(sink.received.allSatisfy { $0.changeID == ids[0] }, "the later change was sent before the earlier one")

            // The operator's view and action: `siwa jobs list/retry` work on deliveries.
            let administration = JobAdministration(connection: connection)
            let discarded = try await administration.list(.init(state: "discarded", kind: "webhook"))
            #expect(discarded.count == 1)
            #expect(discarded.first?.lastError == "answered 503")
            sink.answer { _, _ in .ok }
            #expect(try await administration.retry(.id(try #require(discarded.first?.id))).count == 1)
            try await sink.waitUntil { $0.filter { $0.status == 200 }.count == 2 }
            await running.stop()
            #expect(sink.firstDeliveries.compactMap(\.changeID) == ids)
            #expect(running.registry.render().contains("siwa_webhook_discarded_total 1"))
        }
    }

    /// A slot is free once its request is answered, before the result is written (the writer may
    /// wait on the database), yet an account's next change is not sent before the earlier one's
    /// 2xx is written: the claim sees it `running` until then.
    @Test func slotsFreeAtTheAnswerWhileTheAccountsNextChangeWaitsForTheWrite() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            let sink = try WebhookSink(secret: Self.secret) { request, _ in
                request.body.contains(#""reason":"f-1""#) ? WebhookSink.Answer(held: true) : .ok
            }
            defer { sink.stop() }
            let running = try await RunningDispatcher.start(database, sink: sink, on: connection)  // 8 slots
            try await recordChanges(["first"], count: 2, tag: "f", on: connection)
            let ids = try await changeIDs("first", on: connection)
            try await sink.waitUntil(timeout: .seconds(60)) { _ in sink.arrived.contains { $0.changeID == ids[0] } }

            // Another session holds the first change's job row: its result cannot be written.
            let holder = try await database.connect()
            defer { holder.close() }
            try await holder.simpleQuery(
                "BEGIN; SELECT 1 FROM siwa.jobs WHERE kind = 'webhook' AND args ->> 'change_id' = '\(ids[0])' FOR UPDATE")
            sink.openGate()
            let others = (0..<12).map { "other-\($0)" }
            try await recordChanges(others, count: 1, tag: "o", on: connection)
            // More than the 7 slots left over if a slot lasted until its result was written.
            try await sink.waitUntil(timeout: .seconds(30)) { _ in
                sink.delivered.filter { $0.sub?.hasPrefix("other-") == true }.count == 12
            }
            #expect(!sink.arrived.contains { $0.changeID == ids[1] }, "sent before the earlier change's 2xx was written")

            try await holder.simpleQuery("COMMIT")
            try await connection.waitFor(
                "SELECT count(*) FROM siwa.jobs WHERE kind = 'webhook' AND state = 'completed'", timeout: .seconds(60)
            ) { $0 == 14 }
            await running.stop()
            let answered = try #require(sink.delivered.first { $0.changeID == ids[0] }).answeredAt
            let sent = try #require(sink.arrived.first { $0.changeID == ids[1] }).arrivedAt
            #expect(answered < sent)
            try await expectNoUnexplainedRepeats(sink, on: connection)
        }
    }

    // MARK: Helpers

    /// Records `count` changes for each sub, interleaved, in one statement (as an effect batch does).
    func recordChanges(_ subs: [String], count: Int, tag: String, on connection: PostgresConnection) async throws {
        _ = try await connection.execute(
            """
            INSERT INTO siwa.account_changes (client_id, sub, app_user_id, change, status, reason)
            SELECT 'com.example.app', s.sub, 'user-' || s.sub, 'email_enabled', 'active', \(tag)::text || '-' || i
              FROM generate_series(1, \(count)) AS i, unnest(\(subs)::text[]) WITH ORDINALITY AS s(sub, n)
             ORDER BY i, s.n
            """)
    }

    /// At least once, and no more than that: a change answered 2xx again is allowed only after an
    /// attempt whose answer the worker never saw: a timeout or broken connection (on a loaded machine
    /// a slow answer can arrive after the client gave up), or a claim whose worker died before
    /// recording anything. Each extra 2xx needs one such attempt: the job's claims (`attempt`) minus
    /// the one that succeeded minus the failures it recorded with an answer.
    func expectNoUnexplainedRepeats(_ sink: WebhookSink, on connection: PostgresConnection) async throws {
        var answers: [Int64: Int] = [:]
        for received in sink.delivered { if let id = received.changeID { answers[id, default: 0] += 1 } }
        for (id, count) in answers where count > 1 {
            let unseen = try await connection.int(
                """
                SELECT j.attempt - 1 - (SELECT count(*) FROM jsonb_array_elements(j.errors) e
                                         WHERE e ->> 'error' LIKE 'answered %')
                  FROM siwa.jobs j WHERE j.kind = 'webhook' AND j.args ->> 'change_id' = \(String(id))
                """)
            #expect(count <= 1 + unseen, "change \(id) answered 2xx \(count) times after \(unseen) unanswered attempts")
        }
    }

    func changeIDs(_ sub: String, on connection: PostgresConnection) async throws -> [Int64] {
        try await connection.query("SELECT id FROM siwa.account_changes WHERE sub = \(sub) ORDER BY id")
            .map { try $0.decode(Int64.self, column: "id") }
    }
}

/// A dispatcher running in this process, stopped by the test, or when the test lets go of it (a
/// test that throws must not leave it delivering against a dropped database).
/// The delivery timeout is the contract's 10 s times `TestTimeScale` unless a test gives one to
/// run out.
final class RunningDispatcher: Sendable {
    let dispatcher: WebhookDispatcher
    let task: Task<Void, Never>
    let registry: MetricsRegistry

    init(dispatcher: WebhookDispatcher, task: Task<Void, Never>, registry: MetricsRegistry) {
        self.dispatcher = dispatcher
        self.task = task
        self.registry = registry
    }

    deinit { dispatcher.stop() }

    static func start(
        _ database: MigratedDatabase, sink: WebhookSink? = nil, url: String? = nil, timeout: Duration = TestTimeScale.scaled(.seconds(10)),
        window: Duration = .seconds(86_400), on connection: PostgresConnection
    ) async throws -> RunningDispatcher {
        try await start(databaseURL: database.url, sink: sink, url: url, timeout: timeout, window: window, on: connection)
    }

    static func start(
        databaseURL: String, sink: WebhookSink? = nil, url: String? = nil, timeout: Duration = TestTimeScale.scaled(.seconds(10)),
        window: Duration = .seconds(86_400), on connection: PostgresConnection
    ) async throws -> RunningDispatcher {
        let settings = WebhookSettings(
            url: try #require(URL(string: url ?? sink?.url ?? "")), secret: try WebhookSecret(WebhookDeliveryTests.secret),
            concurrency: 8, timeout: timeout, retryWindow: window)
        let registry = MetricsRegistry()
        let dispatcher = WebhookDispatcher(
            settings: settings, databaseURL: databaseURL,
            options: .init(
                workerID: "test-webhooks", lease: .seconds(5), pollInterval: .milliseconds(100), shutdownGrace: .seconds(2),
                retryPolicy: RetryPolicy(base: .milliseconds(20), cap: .milliseconds(200))),
            registry: registry, logger: TestDatabase.logger)
        let running = RunningDispatcher(dispatcher: dispatcher, task: Task { await dispatcher.run() }, registry: registry)
        // Changes are queued from the registration on. (A bound, not a speed: at load 14 one
        // registration took over 30 s to commit while the whole suite ran.)
        try await connection.waitFor("SELECT count(*) FROM siwa.webhook_endpoint", timeout: .seconds(60)) { $0 == 1 }
        return running
    }

    func stop() async {
        dispatcher.stop()
        await task.value
    }

    /// Waits (bounded) until the gauge `name` on this dispatcher's metrics satisfies `condition`
    /// (the gauges are refreshed by the maintenance pass, every lease / 3).
    func waitForGauge(_ name: String, timeout: Duration = .seconds(30), _ condition: (Double) -> Bool) async throws {
        var value: Double?
        try await waitUntil("gauge \(name) reaches its condition", timeout: timeout, every: .milliseconds(50), detail: "last \(value.map { "\($0)" } ?? "absent")") {
            let line = registry.render().split(separator: "\n").first { $0.hasPrefix(name + " ") }
            value = line.flatMap { $0.split(separator: " ").last }.flatMap { Double(String($0)) }
            return value.map(condition) ?? false
        }
    }
}
