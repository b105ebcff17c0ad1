import FakeApple
import Foundation
import Postgres
import TestTiming
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Real `siwa-worker` processes calling a fake Apple, under faults: workers killed mid-batch,
/// Apple's revoke endpoint failing every way it can.
@Suite("Faults: workers and Apple", .serialized)
struct FaultWorkerTests {
    @Test func workersKilledMidBatchApplyEachEffectOnceAndRevokeEveryDeletion() async throws {
        try await withWorkersAgainstFakeApple { apple, database, connection, teardown in
            // The survivor runs throughout; victims come and go.
            let survivor = try database.startWorker(apple.environment.merging(["SIWA_NOTIFICATION_BATCH": "5"]) { _, new in new })
            teardown.add { await survivor.stop() }
            let subs = (1...20).map { "kill-\($0)" }
            try await apple.link(subs, prefix: "kill-", on: connection)

            // Deletions and notifications in flight together.
            try await database.queueNotifications(1500, on: connection)
            for sub in subs {
                _ = try await connection.query("SELECT siwa.request_deletion(\(FakeAppleForWorkers.clientID), \(sub))")
            }
            var kills = 0
            for round in 0..<3 {
                let victim = try database.startWorker(
                    apple.environment.merging(["SIWA_NOTIFICATION_BATCH": "5", "SIWA_WORKER_CONCURRENCY": "8"]) { _, new in new })
                let before = try await connection.int(processedCount)
                // Let it claim work (its first progress shows it is mid-stream), then kill it.
                // Not reaching it is no failure: the kill comes anyway, and `kills` counts it.
                try? await waitUntil("the victim made progress", timeout: .seconds(10)) {
                    if !victim.isRunning { return true }
                    return try await connection.int(processedCount) >= min(1500, before + 50 * (round + 1))
                }
                try await Task.sleep(for: .milliseconds(Int.random(in: 50...300)))
                if victim.isRunning {
                    victim.signal(SIGKILL)
                    kills += 1
                }
                _ = await victim.waitForExit(timeout: .seconds(5))
            }
            #expect(kills == 3)

            try await connection.waitFor(processedCount, timeout: .seconds(30)) { $0 == 1500 }
            try await connection.waitFor(
                "SELECT count(*) FROM siwa.accounts WHERE sub LIKE 'kill-%' AND status = 'deleted'", timeout: .seconds(30)
            ) { $0 == subs.count }
            try await connection.waitFor("SELECT count(*) FROM siwa.jobs WHERE state <> 'completed'", timeout: .seconds(30)) { $0 == 0 }

            let result = try await connection.expectExactlyOnce(total: 1500)
            #expect(result.processed == 1500)
            #expect(result.duplicates == 0, "an effect was applied twice")
            #expect(result.changes == result.applied)
            #expect(result.applied == 1500)
            // Each deletion: revoked at Apple (at least once), one 'deleted' change.
            for sub in subs {
                #expect(apple.everyTokenRevoked(sub), "\(sub) not revoked at Apple")
                let deleted = try await connection.int(
                    "SELECT count(*) FROM siwa.account_changes WHERE sub = \(sub) AND change = 'deleted'")
                #expect(deleted == 1, "\(sub): \(deleted) 'deleted' changes")
            }
            let revokes = apple.fake.calls.filter { $0.endpoint == "revoke" }
            #expect(revokes.filter { $0.status == 200 }.count >= subs.count)
            #expect(revokes.allSatisfy { $0.validClientSecret })
            print("fault.sigkill: kills=\(kills) revoke_calls=\(revokes.count) for \(subs.count) deletions")
        }
    }

    @Test func flappingRevokeEndpointEndsWithEveryDeletionDone() async throws {
        try await withWorkersAgainstFakeApple(hang: .seconds(12)) { apple, database, connection, teardown in
            // A long lease: the injected hang holds a call for the whole Apple timeout, and a lease
            // lost to a late heartbeat on a loaded machine would re-run the job and add a call.
            let worker = try database.startWorker(apple.environment.merging(["SIWA_JOB_LEASE": "60s"]) { $1 })
            teardown.add { await worker.stop() }
            let subs = (1...3).map { "flap-\($0)" }
            try await apple.link(subs, prefix: "flap-", on: connection)

            // 500, 503, a hang past the worker's Apple timeout, 429 with Retry-After 1; then success.
            apple.fake.injectFailures(
                endpoint: "revoke", responses: [.status(500), .status(503), .timeout, .status(429)], retryAfter: "1")
            for sub in subs {
                _ = try await connection.query("SELECT siwa.request_deletion(\(FakeAppleForWorkers.clientID), \(sub))")
            }
            try await connection.waitFor(
                "SELECT count(*) FROM siwa.accounts WHERE sub LIKE 'flap-%' AND status = 'deleted'", timeout: .seconds(90)
            ) { $0 == subs.count }

            let statuses = apple.fake.calls.filter { $0.endpoint == "revoke" }.map(\.status)
            #expect(Set(statuses).isSuperset(of: [500, 503, 0, 429, 200]), "\(statuses)")
            #expect(statuses.filter { $0 == 200 }.count == subs.count, "\(statuses)")
            for sub in subs {
                #expect(apple.everyTokenRevoked(sub))
                #expect(try await connection.int(
                    "SELECT count(*) FROM siwa.account_changes WHERE sub = \(sub) AND change = 'deleted'") == 1)
            }
            // Every failure is on the jobs' error lists; none was discarded.
            #expect(try await connection.int(
                "SELECT coalesce(sum(jsonb_array_length(errors)), 0)::int FROM siwa.jobs WHERE kind = 'revoke'") == 4)
            #expect(try await connection.int("SELECT count(*) FROM siwa.jobs WHERE state = 'discarded'") == 0)
            print("fault.flapping: revoke statuses \(statuses)")
        }
    }
}
