import FakeApple
import Foundation
import JobQueue
import Postgres
import Testing
import TestTiming

#if canImport(Glibc)
    import Glibc
#endif

/// A job whose process dies while running it, three times over (a real `siwa-worker` SIGKILLed
/// while blocked in a call that never answers): discarded with `process_died` and kept, shown by
/// `siwa status` and `siwa jobs list`, the other jobs still run, and `siwa jobs retry` runs it again
/// with a fresh count.
@Suite("Jobs whose process died", .serialized)
struct ProcessDiedTests {
    @Test func aRevokeWhoseWorkerDiesThreeTimesIsDiscardedAndRetried() async throws {
        try await withWorkersAgainstFakeApple { apple, database, connection, teardown in
            let first = try database.startWorker(apple.environment)
            try await apple.link(["doomed", "bystander"], prefix: "", on: connection)

            // Apple's revoke endpoint never answers: each worker blocks in the call until killed.
            apple.fake.closeGate(endpoint: "revoke", after: 0)
            _ = try await connection.query("SELECT siwa.request_deletion(\(FakeAppleForWorkers.clientID), 'doomed')")
            let revoke = try await connection.int("SELECT id::int FROM siwa.jobs WHERE kind = 'revoke'")
            try await Self.killMidCall(first, database: database, environment: apple.environment, times: 3) { kills in
                try await waitUntil("revoke call \(kills + 1) parked", timeout: .seconds(60)) { apple.fake.parkedCalls(endpoint: "revoke") > kills }
            }
            let survivor = try database.startWorker(apple.environment)
            teardown.add { await survivor.stop() }
            try await Self.expectDiscardedAsProcessDied(revoke, on: connection)
            #expect(try await connection.int("SELECT count(*) FROM siwa.accounts WHERE sub = 'doomed' AND status = 'pending_deletion'") == 1)

            // Shown to the operator: the deletion still waits, on a revoke discarded as process_died.
            let status = try await Siwa.run(["status", "--json"], environment: ["DATABASE_URL": database.url])
            let object = try #require(try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any])
            let jobs = try #require(object["jobs"] as? [String: Any])
            let deletions = try #require(object["pending_deletions"] as? [String: Any])
            #expect(jobs["process_died"] as? Int == 1, "\(status.stdout)")
            #expect(deletions["count"] as? Int == 1 && deletions["revokes_process_died"] as? Int == 1, "\(status.stdout)")
            let text = try await Siwa.run(["status"], environment: ["DATABASE_URL": database.url])
            #expect(text.stdout.contains("process_died"), "\(text.stdout)")
            let listed = try await Siwa.run(
                ["jobs", "list", "--state", "discarded"], environment: ["DATABASE_URL": database.url])
            #expect(listed.status == 0 && listed.stdout.contains("process_died") && listed.stdout.contains("revoke"), "\(listed.stdout)")

            // The other jobs run: an exchange and notifications after the discard.
            let code = apple.fake.registerCode(
                clientID: FakeAppleForWorkers.clientID, sub: "latecomer", email: nil, isPrivateEmail: nil)
            _ = try await connection.query(
                "SELECT siwa.link_account(\(FakeAppleForWorkers.clientID), 'latecomer', 'user-latecomer', \(code))")
            try await database.queueNotifications(20, on: connection)
            try await connection.waitFor(
                "SELECT count(*) FROM siwa.accounts WHERE sub = 'latecomer' AND status = 'active'", timeout: .seconds(30)
            ) { $0 == 1 }
            try await connection.waitFor(processedCount, timeout: .seconds(30)) { $0 == 20 }

            // Retried by the operator once Apple answers again: the deletion completes.
            apple.fake.openGate(endpoint: "revoke")
            let retried = try await Siwa.run(["jobs", "retry", String(revoke)], environment: ["DATABASE_URL": database.url])
            #expect(retried.status == 0, "\(retried.stderr)")
            try await connection.waitFor(
                "SELECT count(*) FROM siwa.accounts WHERE sub = 'doomed' AND status = 'deleted'", timeout: .seconds(30)
            ) { $0 == 1 }
            #expect(try await connection.int(
                "SELECT count(*) FROM siwa.jobs WHERE id = \(revoke) AND state = 'completed' AND expired_leases = 0") == 1)
            #expect(apple.everyTokenRevoked("doomed"))
            #expect(!survivor.log.contains("\"level\":\"critical\""))
        }
    }

    @Test func aWebhookDeliveryWhoseWorkerDiesThreeTimesIsDiscardedAndRetried() async throws {
        try await withMigratedDatabase { database in
            try await withTeardown { teardown in
                let connection = try await database.connect()
                defer { connection.close() }
                // The poisoned account's deliveries are held unanswered (until the gate opens); others answer 200.
                let sink = try WebhookSink(secret: WebhookDeliveryTests.secret) { request, _ in
                    request.sub == "poison" ? WebhookSink.Answer(held: true) : .ok
                }
                teardown.add { sink.stop() }
                let environment = [
                    "SIWA_WEBHOOK_URL": sink.url, "SIWA_WEBHOOK_SECRET": WebhookDeliveryTests.secret, "SIWA_RETRY_BASE": "20ms",
                ]
                let first = try database.startWorker(environment)
                try await connection.waitFor("SELECT count(*) FROM siwa.webhook_endpoint", timeout: .seconds(30)) { $0 == 1 }
                try await WebhookDeliveryTests().recordChanges(["poison"], count: 1, tag: "p", on: connection)
                let poison = try #require(try await WebhookDeliveryTests().changeIDs("poison", on: connection).first)
                let job = try await connection.int(
                    "SELECT id::int FROM siwa.jobs WHERE kind = 'webhook' AND args ->> 'change_id' = \(String(poison))")
                try await Self.killMidCall(first, database: database, environment: environment, times: 3) { kills in
                    try await waitUntil("delivery \(kills + 1) arrived", timeout: .seconds(60)) {
                        sink.arrived.filter { $0.changeID == poison }.count > kills
                    }
                }
                let survivor = try database.startWorker(environment)
                teardown.add { await survivor.stop() }
                try await Self.expectDiscardedAsProcessDied(job, on: connection)

                // Other accounts' deliveries go on.
                try await WebhookDeliveryTests().recordChanges(["bystander"], count: 3, tag: "b", on: connection)
                try await sink.waitUntil(timeout: .seconds(30)) { received in received.filter { $0.sub == "bystander" && $0.status == 200 }.count == 3 }
                let listed = try await Siwa.run(
                    ["jobs", "list", "--kind", "webhook", "--state", "discarded"], environment: ["DATABASE_URL": database.url])
                #expect(listed.stdout.contains("process_died"), "\(listed.stdout)")

                sink.openGate()
                let retried = try await Siwa.run(["jobs", "retry", String(job)], environment: ["DATABASE_URL": database.url])
                #expect(retried.status == 0, "\(retried.stderr)")
                try await connection.waitFor(
                    "SELECT count(*) FROM siwa.jobs WHERE id = \(job) AND state = 'completed' AND expired_leases = 0",
                    timeout: .seconds(30)
                ) { $0 == 1 }
                #expect(sink.delivered.contains { $0.changeID == poison && $0.verified })
            }
        }
    }

    /// Every leased kind counts expired leases the same way; the count and only the count decides
    /// (a graceful hand-back is not a death), and an exchange keeps its code for the retry.
    @Test func theThirdExpiredLeaseDiscardsAndRetryStartsTheCountAgain() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            let pool = PostgresPool(conninfo: database.url, size: 2, logger: TestDatabase.logger)
            defer { pool.close() }
            let queue = JobQueue(pool: pool)
            _ = try await connection.query("SELECT siwa.link_account('com.example.app', 'eve', 'user-eve', 'code-eve')")
            func claimAndAbandon() async throws -> [String] {
                #expect(try await queue.claim(worker: "w", limit: 10, lease: .seconds(60)).count == 1)
                try await connection.execute("UPDATE siwa.jobs SET locked_until = now() - interval '1 second'")
                return try await queue.rescueExpired().map(\.state)
            }
            #expect(try await claimAndAbandon() == ["available"])
            // Handed back at shutdown: no death counted.
            let held = try await queue.claim(worker: "w", limit: 10, lease: .seconds(60))
            #expect(try await queue.release(held) == 1)
            #expect(try await claimAndAbandon() == ["available"])
            #expect(try await claimAndAbandon() == ["discarded"])
            let row = try #require(try await connection.query(
                "SELECT kind, errors -> -1 ->> 'error' AS error, args ? 'code' AS has_code, expired_leases FROM siwa.jobs").first)
            #expect(try row.decode(String.self, column: "kind") == "exchange")
            #expect(try row.decode(String?.self, column: "error") == "process_died")
            #expect(try row.decode(Bool.self, column: "has_code"))
            #expect(try row.decode(Int.self, column: "expired_leases") == 3)

            let id = try await connection.int("SELECT id::int FROM siwa.jobs")
            #expect(try await JobAdministration(connection: connection).retry(.id(Int64(id))) == [Int64(id)])
            #expect(try await connection.int("SELECT expired_leases FROM siwa.jobs WHERE state = 'available'") == 0)
            #expect(try await claimAndAbandon() == ["available"])
        }
    }

    /// The lease of a webhook delivery is `SIWA_JOB_LEASE`, as for every other kind.
    @Test func aWebhookDeliveryIsLeasedForTheJobLease() async throws {
        try await withMigratedDatabase { database in
            try await withTeardown { teardown in
                let connection = try await database.connect()
                defer { connection.close() }
                let sink = try WebhookSink(secret: WebhookDeliveryTests.secret) { _, _ in WebhookSink.Answer(held: true) }
                teardown.add { sink.stop() }
                teardown.add { sink.openGate() }
                let worker = try database.startWorker([
                    "SIWA_WEBHOOK_URL": sink.url, "SIWA_WEBHOOK_SECRET": WebhookDeliveryTests.secret, "SIWA_JOB_LEASE": "900s",
                ])
                teardown.add { await worker.stop() }
                try await connection.waitFor("SELECT count(*) FROM siwa.webhook_endpoint", timeout: .seconds(30)) { $0 == 1 }
                try await WebhookDeliveryTests().recordChanges(["leased"], count: 1, tag: "l", on: connection)
                try await waitUntil("delivery arrived", timeout: .seconds(60)) { !sink.arrived.isEmpty }
                // Leased past the default 60 s and no further than 900 s from now (heartbeats renew it).
                #expect(try await connection.int(
                    """
                    SELECT count(*) FROM siwa.jobs WHERE kind = 'webhook' AND state = 'running'
                       AND locked_until > now() + interval '600 seconds' AND locked_until <= now() + interval '900 seconds'
                    """) == 1)
            }
        }
    }

    // MARK: Helpers

    /// Kills `first` once `blocked` says it is in the call, then starts a worker and kills it the same
    /// way, `times` kills in all. `blocked(kills)` waits for the call of the worker after `kills` kills.
    static func killMidCall(
        _ first: ServiceProcess, database: MigratedDatabase, environment: [String: String], times: Int,
        blocked: (Int) async throws -> Void
    ) async throws {
        var victim = first
        for kills in 0..<times {
            try await blocked(kills)
            victim.signal(SIGKILL)
            _ = await victim.waitForExit(timeout: .seconds(10))
            if kills + 1 < times { victim = try database.startWorker(environment) }
        }
    }

    static func expectDiscardedAsProcessDied(_ job: Int, on connection: PostgresConnection) async throws {
        // A bound, not a speed: a worker started on a machine at load 50 took longer than 30 s to start.
        try await connection.waitFor(
            "SELECT count(*) FROM siwa.jobs WHERE id = \(job) AND state = 'discarded'", timeout: .seconds(120)
        ) { $0 == 1 }
        let row = try #require(try await connection.query(
            "SELECT errors -> -1 ->> 'error' AS error, expired_leases, attempt FROM siwa.jobs WHERE id = \(job)").first)
        #expect(try row.decode(String?.self, column: "error") == "process_died")
        #expect(try row.decode(Int.self, column: "expired_leases") == 3)
        #expect(try row.decode(Int.self, column: "attempt") == 3)
    }

}
