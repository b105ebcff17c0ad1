import FakeApple
import Foundation
import LocalPostgres
import Postgres
import Testing
import TestTiming

/// PostgreSQL failing over under a receiver and a worker that keep running: a primary and a
/// synchronous streaming standby on 127.0.0.1, both processes on a multi-host URL
/// (`target_session_attrs=read-write`), the primary killed (`immediate`) and the standby promoted.
///
/// "No job runs twice at Apple", precisely: every link's code is exchanged once, and every refresh
/// token is revoked by exactly one call. A worker that has Apple's answer keeps it through the
/// outage and records it on the new primary (within the job lease), so even a revoke answered while
/// no database was writable is not sent again. Only past the lease (an outage longer than
/// `SIWA_JOB_LEASE`) may a revoke be re-sent, which Apple's revoke tolerates; this test's outage is
/// far shorter.
@Suite("Failover to a promoted standby", .serialized)
struct FailoverTests {
    static let clientID = FakeAppleForWorkers.clientID

    @Test func receiverAndWorkerFollowThePromotedStandbyAndLoseNothing() async throws {
        try await withTeardown { teardown in
            let pair = try await SynchronousPair.start()
            teardown.add { await pair.destroy() }
            let url = pair.url

            let statusBefore = try await Siwa.run(["status", "--json"], environment: ["DATABASE_URL": url])
            #expect(try Self.replication(statusBefore)["synchronous_standby"] as? Bool == true, "\(statusBefore.stdout)")

            let apple = try FakeAppleForWorkers(stoppedBy: teardown)
            let keys = try TestAppleKeys()
            defer { keys.stop() }

            // A session on a standby (a single-host URL, or a proxy that has not followed a failover yet)
            // cannot write. That is 503 and a new session, never 400: Apple does not resend a 400.
            // (It never turns ready: /readyz knows a standby cannot take writes.)
            let onStandby = try ServiceProcess(
                "siwa-receiver",
                environment: [
                    "DATABASE_URL": pair.standby.url, "SIWA_CLIENT_IDS": Self.clientID, "SIWA_LISTEN": "127.0.0.1:0",
                    "SIWA_APPLE_BASE_URL": keys.baseURL, "SIWA_LOG_LEVEL": "info",
                ])
            let standbyBase = "http://127.0.0.1:\(try await onStandby.boundHTTPPort())"
            let standbyBody = try TestAppleKeys.body(keys.sign(TestAppleKeys.claims(sub: "s", jti: "failover-standby")))
            for _ in 0..<2 {
                let (status, body) = try await HTTP.request("POST", standbyBase + "/apple/notifications", body: standbyBody)
                #expect(status == 503, "\(body)")
            }
            #expect(try await HTTP.request("GET", standbyBase + "/readyz").status == 503)
            await onStandby.stop()

            let (receiver, base) = try await ReceiverUnderTest.start(
                databaseURL: url, keys: keys, extra: ["SIWA_LOG_LEVEL": "info"])
            teardown.add { await receiver.stop() }
            let worker = try ServiceProcess(
                "siwa-worker",
                environment: [
                    "DATABASE_URL": url, "SIWA_CLIENT_IDS": Self.clientID, "SIWA_OPS_LISTEN": "127.0.0.1:0",
                    "SIWA_LOG_LEVEL": "info", "SIWA_JOB_LEASE": "10s", "SIWA_POLL_INTERVAL": "200ms",
                    "SIWA_SHUTDOWN_GRACE": "3s",
                ].merging(apple.environment) { _, new in new })
            teardown.add { await worker.stop() }

            let app = try await PostgresConnection.connect(to: url, logger: TestDatabase.logger)
            let subs = (1...24).map { "failover-\($0)" }
            try await apple.link(subs, prefix: "failover-", on: app)
            app.close()

            // Four streams of notifications and one app requesting deletions, none pausing for the failover.
            let clock = ContinuousClock()
            let accepted = LockedBox<[(jti: String, at: ContinuousClock.Instant)]>([])
            let statuses = LockedBox<[Int: Int]>([:])
            let deletionsRequested = LockedBox(0)
            let streaming = LockedBox(true)
            let path = base + "/apple/notifications"
            let streams = Task {
                await withTaskGroup(of: Void.self) { group in
                    for stream in 0..<4 {
                        group.addTask {
                            var sent = 0
                            while streaming.value && sent < 5000 {
                                sent += 1
                                let jti = "failover-\(stream)-\(sent)-\(UUID().uuidString)"
                                let claims = TestAppleKeys.claims(sub: "n-\(stream)-\(sent)", jti: jti)
                                guard let body = try? TestAppleKeys.body(keys.sign(claims)),
                                    let (status, _) = try? await HTTP.request("POST", path, body: body)
                                else { continue }
                                statuses.withValue { $0[status, default: 0] += 1 }
                                if status == 200 { accepted.withValue { $0.append((jti, clock.now)) } }
                                if status != 200 { try? await Task.sleep(for: .milliseconds(20)) }
                            }
                        }
                    }
                    group.addTask { await Self.requestDeletions(subs, url: url, count: deletionsRequested) }
                }
            }

            try await waitUntil("traffic before the failover") { accepted.value.count >= 60 && deletionsRequested.value >= 8 }
            let stopping = clock.now
            try await pair.primary.stop(mode: .immediate)
            let primaryDown = clock.now
            try await pair.standby.promote()
            let promoted = clock.now
            let acceptedAtPromotion = accepted.value.count
            try await waitUntil("200s from the new primary") { accepted.value.count >= acceptedAtPromotion + 60 }
            try await waitUntil("every deletion requested") { deletionsRequested.value == subs.count }
            streaming.value = false
            await streams.value

            // Answers after the primary was gone came from the promoted standby. `pg_ctl promote -w` polls,
            // so the first of them can precede its return by a few tens of milliseconds.
            let firstAfter = try #require(accepted.value.map(\.at).filter { $0 > primaryDown }.min())
            func seconds(_ duration: Duration) -> String { String(format: "%.2f", duration.seconds) }
            print(
                "failover: promotion to first 200 \(seconds(firstAfter - promoted)) s; primary killed to first 200 "
                    + "\(seconds(firstAfter - primaryDown)) s (stop \(seconds(primaryDown - stopping)) s, promote "
                    + "\(seconds(promoted - primaryDown)) s); statuses \(statuses.value)")

            // Everything is read from the new primary, through the same multi-host URL.
            let check = try await PostgresConnection.connect(to: url, logger: TestDatabase.logger)
            defer { check.close() }
            #expect(check.server == "127.0.0.1:\(pair.standby.port)")
            let answered = accepted.value.map(\.jti)
            let stored = Set(
                try await check.query("SELECT jti FROM siwa.notifications WHERE jti LIKE 'failover-%'")
                    .map { try $0.decode(String.self, column: "jti") })
            #expect(Set(answered).count == answered.count)
            #expect(Set(answered).isSubset(of: stored), "\(Set(answered).subtracting(stored).count) answered 200 but not on the new primary")
            #expect(Set(statuses.value.keys).isSubset(of: [200, 503]), "\(statuses.value)")
            #expect(statuses.value[503, default: 0] > 0, "the outage was seen: \(statuses.value)")

            // Each stored notification processed once; each deletion finished; each Apple call once.
            try await check.waitFor(
                "SELECT count(*) FROM siwa.notifications WHERE processed_at IS NULL", timeout: .seconds(30)) { $0 == 0 }
            try await check.waitFor(
                "SELECT count(*) FROM siwa.accounts WHERE sub LIKE 'failover-%' AND status = 'deleted'", timeout: .seconds(30)
            ) { $0 == subs.count }
            try await check.waitFor("SELECT count(*) FROM siwa.jobs WHERE state <> 'completed'", timeout: .seconds(30)) { $0 == 0 }
            let result = try await check.expectExactlyOnce(total: stored.count)
            #expect(result.duplicates == 0, "an effect was applied twice")
            #expect(result.changes == result.applied)
            for sub in subs {
                let tokens = apple.fake.refreshTokens(clientID: Self.clientID, sub: sub)
                #expect(tokens.count == 1, "\(sub): one exchange")
                for token in tokens {
                    #expect(apple.fake.revokeCalls(refreshToken: token) == 1, "\(sub): revoked by exactly one call")
                }
            }
            let calls = apple.fake.calls
            #expect(calls.filter { $0.endpoint == "token" }.count == subs.count, "no code exchanged twice")
            #expect(calls.filter { $0.endpoint == "revoke" }.count == subs.count, "no revoke sent twice")
            #expect(calls.allSatisfy { $0.status == 200 }, "\(calls.filter { $0.status != 200 })")

            // The same processes throughout, and they say where they went.
            #expect(receiver.isRunning && worker.isRunning, "neither process restarted")
            #expect(receiver.log.contains(#""db.server":"127.0.0.1:\#(pair.standby.port)""#), "receiver logs the new primary")
            // The worker's LISTEN connection came back, on the new primary.
            let listening = #"siwa-worker listening again","db.server":"127.0.0.1:\#(pair.standby.port)""#
            try await waitUntil("the worker's listener on the new primary", timeout: .seconds(10)) { worker.log.contains(listening) }

            let statusAfter = try await Siwa.run(["status", "--json"], environment: ["DATABASE_URL": url])
            #expect(try Self.replication(statusAfter)["synchronous_standby"] as? Bool == false, "\(statusAfter.stdout)")
        }
    }

    /// The fix the test above depends on, made deterministic: Apple answers a revoke while the
    /// database is down. Without the worker keeping that answer through the outage, the job's lease
    /// expires and the revoke is sent a second time.
    @Test func aRevokeAnsweredDuringAnOutageIsRecordedNotSentAgain() async throws {
        try await withTeardown { teardown in
            // An immediate stop loses commits the harness's default (synchronous_commit off) has not flushed.
            let cluster = try await LocalPostgresCluster.start(
                logger: TestDatabase.logger, options: .init(settings: ["synchronous_commit": "on"]))
            teardown.add { await cluster.destroy() }
            let setup = try await PostgresConnection.connect(to: cluster.url, logger: TestDatabase.logger)
            try await SiwaMigrations.apply(setup)
            setup.close()
            let apple = try FakeAppleForWorkers(hang: .seconds(2), stoppedBy: teardown)
            let worker = try ServiceProcess(
                "siwa-worker",
                environment: [
                    "DATABASE_URL": cluster.url, "SIWA_CLIENT_IDS": Self.clientID, "SIWA_OPS_LISTEN": "127.0.0.1:0",
                    "SIWA_LOG_LEVEL": "info", "SIWA_JOB_LEASE": "3s", "SIWA_POLL_INTERVAL": "200ms",
                    "SIWA_SHUTDOWN_GRACE": "3s", "SIWA_RETRY_BASE": "100ms",
                ].merging(apple.environment) { _, new in new })
            teardown.add { await worker.stop() }

            var app = try await PostgresConnection.connect(to: cluster.url, logger: TestDatabase.logger)
            try await apple.link(["outage-1"], prefix: "outage-", on: app)
            apple.fake.injectFailures(endpoint: "revoke", responses: [.slow])
            _ = try await app.query("SELECT siwa.request_deletion(\(Self.clientID), 'outage-1')")
            app.close()

            // The revoke has reached Apple (which holds its answer for two seconds); the database goes away
            // and stays away until the worker has the answer and has failed to record it.
            try await waitUntil("a revoke reached Apple", timeout: .seconds(20), every: .milliseconds(10)) {
                apple.fake.calls.contains { $0.endpoint == "revoke" }
            }
            try await cluster.stop(mode: .immediate)
            let failedToRecord = [#""db.operation":"record revoke""#, "revoked at Apple but not recorded"]
            try await waitUntil("the worker got Apple's answer and failed to record it", timeout: .seconds(20), detail: worker.log) {
                failedToRecord.contains(where: worker.log.contains)
            }
            try await cluster.startAgain()

            app = try await PostgresConnection.connect(to: cluster.url, logger: TestDatabase.logger)
            defer { app.close() }
            do {
                try await app.waitFor(
                    "SELECT count(*) FROM siwa.accounts WHERE sub = 'outage-1' AND status = 'deleted'", timeout: .seconds(20)
                ) { $0 == 1 }
            } catch {
                Issue.record("\(error)\n\(worker.log)")
                return
            }
            // Deleted means a revoke's answer was recorded: without the fix, only the second run's could be.
            let token = try #require(apple.fake.refreshTokens(clientID: Self.clientID, sub: "outage-1").first)
            #expect(apple.fake.revokeCalls(refreshToken: token) == 1, "the revoke was sent again:\n\(worker.log)")
            #expect(try await app.int("SELECT attempt FROM siwa.jobs WHERE kind = 'revoke'") == 1)
        }
    }

    /// The app's side: `siwa.request_deletion` for each sub, about ten a second, retried on a new
    /// connection when the database goes away (calling it again returns the same job).
    static func requestDeletions(_ subs: [String], url: String, count: LockedBox<Int>) async {
        var connection: PostgresConnection?
        for sub in subs {
            while true {
                do {
                    if connection == nil || connection?.isUsable == false {
                        connection?.close()
                        connection = try await PostgresConnection.connect(to: url, logger: TestDatabase.logger)
                    }
                    _ = try await connection!.query("SELECT siwa.request_deletion(\(clientID), \(sub))")
                    break
                } catch {
                    connection?.close()
                    connection = nil
                    try? await Task.sleep(for: .milliseconds(50))
                }
            }
            count.withValue { $0 += 1 }
            try? await Task.sleep(for: .milliseconds(100))
        }
        connection?.close()
    }

    static func replication(_ run: Siwa.Run) throws -> [String: Any] {
        let object = try JSONSerialization.jsonObject(with: Data(run.stdout.utf8)) as? [String: Any]
        return try #require(object?["replication"] as? [String: Any], "\(run.stdout)\(run.stderr)")
    }
}

/// A primary with one synchronous streaming standby, and the multi-host URL over both.
struct SynchronousPair {
    let primary: LocalPostgresCluster
    let standby: LocalPostgresCluster
    var url: String { LocalPostgresCluster.multiHostURL([primary, standby]) }

    static func start() async throws -> SynchronousPair {
        // The harness turns synchronous_commit off for speed; zero loss needs it on.
        let primary = try await LocalPostgresCluster.start(
            logger: TestDatabase.logger, options: .init(settings: ["synchronous_commit": "on"]))
        let standby: LocalPostgresCluster
        do {
            standby = try await primary.startStandby(name: "siwa_standby")
        } catch {
            await primary.destroy()
            throw error
        }
        let pair = SynchronousPair(primary: primary, standby: standby)
        do {
            try await primary.requireSynchronousStandby("siwa_standby")
            let setup = try await PostgresConnection.connect(to: pair.url, logger: TestDatabase.logger)
            defer { setup.close() }
            try await SiwaMigrations.apply(setup)
            return pair
        } catch {
            await pair.destroy()
            throw error
        }
    }

    func destroy() async {
        await primary.destroy()
        await standby.destroy()
    }
}

extension Duration {
    fileprivate var seconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
}
