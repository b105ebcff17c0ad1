import Foundation
import LocalPostgres
import Postgres
import TestTiming
import Testing

/// PostgreSQL stopped and started again under a receiver and a worker that keep running.
@Suite("Faults: database restart")
struct FaultDatabaseTests {
    @Test func receiverAndWorkerRideOutARestartAndLoseNothing() async throws {
        try await withTeardown { teardown in
            // A cluster of its own: stopping the shared one would break the other tests.
            let cluster = try await LocalPostgresClusterForTest.start()
            teardown.add { await cluster.destroy() }
            let setup = try await PostgresConnection.connect(to: cluster.url, logger: TestDatabase.logger)
            try await SiwaMigrations.apply(setup)
            setup.close()

            let keys = try TestAppleKeys()
            defer { keys.stop() }
            let (receiver, base) = try await ReceiverUnderTest.start(
                databaseURL: cluster.url, keys: keys, extra: ["SIWA_LOG_LEVEL": "info"])
            teardown.add { await receiver.stop() }
            let worker = try ServiceProcess(
                "siwa-worker",
                environment: [
                    "DATABASE_URL": cluster.url, "SIWA_CLIENT_IDS": "com.example.app", "SIWA_APPLE_CALLS": "disabled",
                    "SIWA_OPS_LISTEN": "127.0.0.1:0", "SIWA_LOG_LEVEL": "info", "SIWA_JOB_LEASE": "2s",
                    "SIWA_POLL_INTERVAL": "200ms", "SIWA_SHUTDOWN_GRACE": "3s",
                ])
            teardown.add { await worker.stop() }
            let path = base + "/apple/notifications"

            // Four streams post without pause until told to stop.
            let accepted = LockedBox<[String]>([])
            let statuses = LockedBox<[Int: Int]>([:])
            let streaming = LockedBox(true)
            let streams = Task {
                await withTaskGroup(of: Void.self) { group in
                    for stream in 0..<4 {
                        group.addTask {
                            var sent = 0
                            while streaming.value && sent < 5000 {
                                sent += 1
                                let jti = "restart-\(stream)-\(sent)-\(UUID().uuidString)"
                                guard let body = try? TestAppleKeys.body(keys.sign(TestAppleKeys.claims(sub: "s-\(stream)-\(sent)", jti: jti))),
                                    let (status, _) = try? await HTTP.request("POST", path, body: body)
                                else { continue }
                                statuses.withValue { $0[status, default: 0] += 1 }
                                if status == 200 { accepted.withValue { $0.append(jti) } }
                                if status != 200 { try? await Task.sleep(for: .milliseconds(20)) }
                            }
                        }
                    }
                }
            }
            // A stall is 60 s without one more acceptance, not a total time: on a loaded machine
            // (load 16 seen) the debug-built streams sign and post slowly but keep going.
            func waitForAccepted(atLeast count: Int) async throws {
                var progress = (count: accepted.value.count, at: ContinuousClock.now)
                while accepted.value.count < count {
                    if accepted.value.count > progress.count { progress = (accepted.value.count, ContinuousClock.now) }
                    guard ContinuousClock.now < progress.at + TestTimeScale.scaled(.seconds(60)) else {
                        throw ServiceProcessError(message: "stream stalled at \(accepted.value.count)")
                    }
                    try await Task.sleep(for: .milliseconds(20))
                }
            }
            try await waitForAccepted(atLeast: 50)
            try await cluster.stop()
            // The outage lasts until every stream has been refused at least once more (not a fixed
            // time: under load a fixed sleep may end before anyone has noticed).
            let refusedBefore = statuses.value[503, default: 0]
            try await waitUntil("every stream was refused during the outage", detail: "\(statuses.value)") {
                statuses.value[503, default: 0] >= refusedBefore + 4
            }
            let duringOutage = accepted.value.count
            try await cluster.startAgain()
            try await waitForAccepted(atLeast: duringOutage + 50)
            streaming.value = false
            await streams.value

            let check = try await PostgresConnection.connect(to: cluster.url, logger: TestDatabase.logger)
            defer { check.close() }
            let all = accepted.value
            let stored = Set(try await check.query("SELECT jti FROM siwa.notifications").map { try $0.decode(String.self, column: "jti") })
            #expect(Set(all).isSubset(of: stored), "\(Set(all).subtracting(stored).count) answered 200 but not stored")
            let seen = statuses.value
            #expect(Set(seen.keys).isSubset(of: [200, 503]), "\(seen)")
            #expect(seen[503, default: 0] > 0, "the outage was seen: \(seen)")
            // The worker reconnects and drains everything stored, each effect once.
            try await check.waitFor(processedCount, timeout: .seconds(30)) { $0 == stored.count }
            try await check.waitFor("SELECT count(*) FROM siwa.jobs WHERE state <> 'completed'", timeout: .seconds(30)) { $0 == 0 }
            let result = try await check.expectExactlyOnce(total: stored.count)
            #expect(result.duplicates == 0)
            #expect(result.changes == result.applied)
            #expect(worker.isRunning, "the worker survived the outage")
            #expect(receiver.isRunning)
            print("fault.db_restart: statuses \(seen), stored \(stored.count), processed \(result.processed)")
        }
    }
}
