import CryptoCore
import Foundation
import JOSE
import LocalPostgres
import Postgres
import TestTiming
import Testing
import Metrics

/// A real `siwa-receiver` process on 127.0.0.1, a real PostgreSQL, and a local stand-in for
/// Apple's key endpoint, driven over HTTP.
@Suite("siwa-receiver process") struct ReceiverProcessTests {
    @Test func validNotificationIsStoredWithItsJob() async throws {
        try await withMigratedDatabase { database in
            let keys = try TestAppleKeys()
            defer { keys.stop() }
            let (receiver, base) = try await ReceiverUnderTest.start(databaseURL: database.url, keys: keys)
            let jti = "jti-\(UUID().uuidString)"
            let jws = try keys.sign(TestAppleKeys.claims(type: "email-disabled", sub: "s1", jti: jti, email: "a@privaterelay.appleid.com"))
            let (status, body) = try await HTTP.request("POST", base + "/apple/notifications", body: TestAppleKeys.body(jws))
            #expect(status == 200, "\(body)")

            let connection = try await database.connect()
            defer { connection.close() }
            let rows = try await connection.query(
                "SELECT client_id, sub, event_type, email, is_private_email, jws FROM siwa.notifications WHERE jti = \(jti)")
            #expect(rows.count == 1)
            let row = try #require(rows.first)
            #expect(try row.decode(String.self, column: "client_id") == "com.example.app")
            #expect(try row.decode(String.self, column: "event_type") == "email-disabled")
            #expect(try row.decode(Bool?.self, column: "is_private_email") == true)
            #expect(try row.decode(String.self, column: "jws") == jws)
            let jobs = try await connection.query("SELECT kind FROM siwa.jobs WHERE notification_jti = \(jti)")
            #expect(jobs.count == 1)
            await receiver.stop()
            #expect(await receiver.waitForExit() == 0)
        }
    }

    @Test func concurrentDuplicatesGiveOneRowAndOneJob() async throws {
        try await withMigratedDatabase { database in
            try await withTeardown { teardown in
                let keys = try TestAppleKeys()
                defer { keys.stop() }
                let (receiver, base) = try await ReceiverUnderTest.start(databaseURL: database.url, keys: keys)
                teardown.add { await receiver.stop() }
                let jti = "dup-\(UUID().uuidString)"
                let body = TestAppleKeys.body(try keys.sign(TestAppleKeys.claims(jti: jti)))
                let statuses = try await withThrowingTaskGroup(of: Int.self) { group in
                    for _ in 0..<24 {
                        group.addTask { try await HTTP.request("POST", base + "/apple/notifications", body: body).status }
                    }
                    return try await group.reduce(into: [Int]()) { $0.append($1) }
                }
                #expect(statuses.allSatisfy { $0 == 200 }, "\(statuses)")
                let connection = try await database.connect()
                defer { connection.close() }
                #expect(try await connection.query("SELECT 1 FROM siwa.notifications WHERE jti = \(jti)").count == 1)
                #expect(try await connection.query("SELECT 1 FROM siwa.jobs WHERE notification_jti = \(jti)").count == 1)
            }
        }
    }

    /// What the receiver refused reaches siwa.rejections (`siwa status`, the console), counted per
    /// minute and reason through siwa.count_rejections by a login that has only siwa_receiver's rights.
    @Test func refusalsAreCountedInTheDatabaseByTheReceiversRole() async throws {
        try await withMigratedDatabase { database in try await database.withReceiverLogin { receiverURL in
            try await withTeardown { teardown in
                let keys = try TestAppleKeys()
                defer { keys.stop() }
                let (receiver, base) = try await ReceiverUnderTest.start(databaseURL: receiverURL, keys: keys)
                teardown.add { await receiver.stop() }
                let path = base + "/apple/notifications"
                let otherKey = try RSA.PrivateKey.generate()
                for _ in 0..<2 { #expect(try await HTTP.request("POST", path, body: Data("hello".utf8)).status == 400) }
                let forged = TestAppleKeys.body(try keys.sign(TestAppleKeys.claims(), with: otherKey))
                #expect(try await HTTP.request("POST", path, body: forged).status == 401)

                let connection = try await database.connect()
                defer { connection.close() }
                // Flushed every 5 s: the three may land in one minute's row or in two.
                var counted = ""
                try await waitUntil("the receiver counted its refusals in siwa.rejections", detail: counted) {
                    counted = try await connection.query("""
                        SELECT coalesce(string_agg(reason || '=' || total, ',' ORDER BY reason), '')
                          FROM (SELECT reason, sum(count) AS total FROM siwa.rejections GROUP BY reason) t
                        """)[0].decode(String.self, at: 0)
                    return counted == "bad_signature=1,body_not_json=2"
                }
            }
        } }
    }

    @Test func contractStatusTable() async throws {
        try await withMigratedDatabase { database in
            try await withTeardown { teardown in
                let keys = try TestAppleKeys()
                defer { keys.stop() }
                let (receiver, base) = try await ReceiverUnderTest.start(databaseURL: database.url, keys: keys)
                teardown.add { await receiver.stop() }
                let path = base + "/apple/notifications"
                let otherKey = try RSA.PrivateKey.generate()

                func post(_ body: Data) async throws -> (Int, String) { try await HTTP.request("POST", path, body: body) }
                func signed(_ claims: [String: Any]) throws -> Data { TestAppleKeys.body(try keys.sign(claims)) }

                let header = Base64URL.encode(Array(#"{"alg":"none","kid":"test-key-1"}"#.utf8))
                let payload = Base64URL.encode(try JSONSerialization.data(withJSONObject: TestAppleKeys.claims()))
                let hsHeader = Base64URL.encode(Array(#"{"alg":"HS256","kid":"test-key-1"}"#.utf8))
                let hsSignature = HMACSHA256.authenticationCode(
                    for: Array("\(hsHeader).\(payload)".utf8), key: Array(keys.signingKey.publicKey.pemRepresentation.utf8))

                var farFuture = TestAppleKeys.claims()
                farFuture["events"] = #"{"type":"consent-revoked","sub":"s1","event_time":1e19}"#
                var textExp = TestAppleKeys.claims()
                textExp["exp"] = "tomorrow"
                let cases: [(String, Data, Int, String)] = [
                    ("not JSON", Data("hello".utf8), 400, "body_not_json"),
                    ("no payload", Data(#"{"token":"x"}"#.utf8), 400, "payload_missing"),
                    ("payload not a string", Data(#"{"payload":42}"#.utf8), 400, "payload_missing"),
                    ("two parts", Data(#"{"payload":"abc.def"}"#.utf8), 400, "jws_malformed"),
                    ("alg none", TestAppleKeys.body("\(header).\(payload)."), 401, "alg_not_allowed"),
                    ("HS256 keyed with the public key", TestAppleKeys.body("\(hsHeader).\(payload).\(Base64URL.encode(hsSignature))"), 401, "alg_not_allowed"),
                    ("another key under our kid", TestAppleKeys.body(try keys.sign(TestAppleKeys.claims(), with: otherKey)), 401, "bad_signature"),
                    ("wrong iss", try signed(TestAppleKeys.claims(issuer: "https://evil.example")), 401, "wrong_issuer"),
                    ("wrong aud", try signed(TestAppleKeys.claims(audience: "com.other.app")), 401, "wrong_audience"),
                    ("expired", try signed(TestAppleKeys.claims(expires: Date().addingTimeInterval(-3600))), 401, "expired"),
                    ("events missing", try signed(["iss": "https://appleid.apple.com", "aud": "com.example.app", "jti": "x"]), 400, "events_missing"),
                    // Its milliseconds overflow Int64: this trapped the committer thread and took the process down.
                    ("event_time 1e19", try signed(farFuture), 400, "events_malformed"),
                    ("exp not a number", try signed(textExp), 400, "claim_malformed"),
                ]
                for (name, body, status, code) in cases {
                    let (gotStatus, gotBody) = try await post(body)
                    #expect(gotStatus == status, "\(name): \(gotBody)")
                    #expect(gotBody == #"{"error":"\#(code)"}"#, "\(name)")
                }

                // A second audience from SIWA_CLIENT_IDS, docs-shaped claims without exp: accepted.
                let docsShaped: [String: Any] = [
                    "iss": "https://appleid.apple.com", "aud": "com.example.app.web", "iat": 1_508_184_845, "jti": "docs-\(UUID())",
                    "events": ["type": "account-delete", "sub": "s9", "event_time": 1_508_184_845],
                ]
                #expect(try await post(signed(docsShaped)).0 == 200)

                #expect(try await HTTP.request("POST", path, body: Data(count: 64 * 1024 + 1)).status == 413)
                #expect(try await HTTP.request("GET", path).status == 405)
                #expect(try await HTTP.request("POST", base + "/elsewhere", body: Data("{}".utf8)).status == 404)
                #expect(try await HTTP.request("GET", base + "/healthz").status == 200)
                let metrics = try await HTTP.request("GET", base + "/metrics").body
                #expect(metrics.contains(#"siwa_receiver_requests_total{reason="alg_not_allowed",status="401"} 2"#))
                #expect(metrics.contains("siwa_receiver_commit_seconds_bucket"))
                // Every POST that reached the handler is timed to its answer (the 413 never does); only
                // the one stored notification waited for a commit.
                #expect(metrics.contains("siwa_receiver_request_seconds_count \(cases.count + 1)\n"), "\(metrics)")
                #expect(metrics.contains("siwa_receiver_commit_wait_seconds_count 1\n"), "\(metrics)")

                // Nothing rejected was stored.
                let connection = try await database.connect()
                defer { connection.close() }
                #expect(try await connection.query("SELECT 1 FROM siwa.notifications").count == 1)
            }
        }
    }

    @Test func unknownKeyIsRefetchedOnceThenRefused() async throws {
        try await withMigratedDatabase { database in
            try await withTeardown { teardown in
                let keys = try TestAppleKeys()
                defer { keys.stop() }
                let (receiver, base) = try await ReceiverUnderTest.start(
                    databaseURL: database.url, keys: keys, extra: ["SIWA_JWKS_REFETCH_INTERVAL": "1"])
                teardown.add { await receiver.stop() }
                let path = base + "/apple/notifications"
                /// Posts `body` again while the refetch rate limit answers for it (503 `keys_unavailable`,
                /// no fetch made), until the interval has passed (bounded). Returns the first other answer
                /// and how many fetches it caused.
                func postOnceTheIntervalPassed(_ body: Data) async throws -> (status: Int, body: String, fetches: Int) {
                    var answer = (status: 0, body: "", fetches: 0)
                    // Run out, it returns the last 503: the caller's expectations say what was wanted.
                    try? await waitUntil("the refetch interval passed", timeout: .seconds(20), every: .milliseconds(50)) {
                        let before = keys.fetchCount
                        let (status, text) = try await HTTP.request("POST", path, body: body)
                        answer = (status, text, keys.fetchCount - before)
                        return !(status == 503 && answer.fetches == 0)
                    }
                    return answer
                }
                // Apple rotates in a new key: the first token under it once the interval since start-up has
                // passed triggers a refetch and passes.
                let rotated = try RSA.PrivateKey.generate()
                keys.publish([(keys.keyID, keys.signingKey.publicKey), ("rotated-2", rotated.publicKey)])
                let newKid = TestAppleKeys.body(try keys.sign(TestAppleKeys.claims(), keyID: "rotated-2", with: rotated))
                #expect(try await postOnceTheIntervalPassed(newKid).status == 200)

                // A kid Apple does not have, once the interval has passed: refetched once, then 401.
                let absent = TestAppleKeys.body(try keys.sign(TestAppleKeys.claims(), keyID: "absent-1", with: rotated))
                let (absentStatus, absentBody, absentFetches) = try await postOnceTheIntervalPassed(absent)
                #expect(absentStatus == 401 && absentBody.contains("unknown_kid"), "\(absentStatus) \(absentBody)")
                #expect(absentFetches == 1)

                // A burst of them refetches at most once per interval; one the rate limit kept from
                // asking Apple is 503 (we do not know), never 401.
                let before = keys.fetchCount
                let started = ContinuousClock.now
                var refused = 0
                for _ in 0..<20 {
                    let forged = TestAppleKeys.body(try keys.sign(TestAppleKeys.claims(), keyID: "nope-\(UUID())", with: rotated))
                    let (status, body) = try await HTTP.request("POST", path, body: forged)
                    #expect(
                        (status == 401 && body.contains("unknown_kid")) || (status == 503 && body.contains("keys_unavailable")),
                        "\(status) \(body)")
                    if status == 401 { refused += 1 }
                }
                let fetches = keys.fetchCount - before
                let allowed = 1 + Int((ContinuousClock.now - started).seconds)
                #expect(fetches <= allowed, "\(fetches) fetches for 20 forged kids")
                #expect(refused <= fetches, "\(refused) answered 401 after \(fetches) refetches")

                // Apple's key endpoint down: cached keys keep verifying; an unseen kid is 503, not 401.
                keys.setUp(false)
                let unseen = TestAppleKeys.body(try keys.sign(TestAppleKeys.claims(), keyID: "unseen-3", with: rotated))
                // Once the interval has passed, the unseen kid makes the receiver ask the endpoint, which
                // is down: 503, never 401. The cached keys keep verifying.
                let (status, body, downFetches) = try await postOnceTheIntervalPassed(unseen)
                #expect(downFetches == 1 && status == 503 && body.contains("keys_unavailable"), "\(downFetches) \(status) \(body)")
                #expect(try await HTTP.request("POST", path, body: TestAppleKeys.body(try keys.sign(TestAppleKeys.claims()))).status == 200)
            }
        }
    }

    @Test func unknownKeyWithTheRefetchRateLimitedIs503() async throws {
        try await withMigratedDatabase { database in
            try await withTeardown { teardown in
                let keys = try TestAppleKeys()
                defer { keys.stop() }
                // The fetch at start-up is the last one for an hour.
                let (receiver, base) = try await ReceiverUnderTest.start(
                    databaseURL: database.url, keys: keys, extra: ["SIWA_JWKS_REFETCH_INTERVAL": "3600"])
                teardown.add { await receiver.stop() }
                let rotated = try RSA.PrivateKey.generate()
                keys.publish([(keys.keyID, keys.signingKey.publicKey), ("rotated-2", rotated.publicKey)])
                let before = keys.fetchCount
                // Apple may well have this key now; without asking, 401 would refuse a real notification.
                let newKid = TestAppleKeys.body(try keys.sign(TestAppleKeys.claims(), keyID: "rotated-2", with: rotated))
                let (status, body) = try await HTTP.request("POST", base + "/apple/notifications", body: newKid)
                #expect(status == 503 && body == #"{"error":"keys_unavailable"}"#, "\(status) \(body)")
                #expect(keys.fetchCount == before)
            }
        }
    }

    @Test func databaseOutageAnswers503ThenRecoversAndLosesNothing() async throws {
        try await withTeardown { teardown in
            // A cluster of its own: stopping the shared one would break the other tests.
            let cluster = try await LocalPostgresClusterForTest.start()
            teardown.add { await cluster.destroy() }
            let setup = try await PostgresConnection.connect(to: cluster.url, logger: TestDatabase.logger)
            try await SiwaMigrations.apply(setup)
            setup.close()

            let keys = try TestAppleKeys()
            defer { keys.stop() }
            let (receiver, base) = try await ReceiverUnderTest.start(databaseURL: cluster.url, keys: keys)
            teardown.add { await receiver.stop() }
            let path = base + "/apple/notifications"

            var accepted: [String] = []
            var statuses: [Int: Int] = [:]
            func send(_ count: Int) async throws {
                for _ in 0..<count {
                    let jti = "outage-\(UUID().uuidString)"
                    let status = try await HTTP.request("POST", path, body: TestAppleKeys.body(try keys.sign(TestAppleKeys.claims(jti: jti)))).status
                    statuses[status, default: 0] += 1
                    if status == 200 { accepted.append(jti) }
                    #expect(status == 200 || status == 503, "got \(status)")
                }
            }
            try await send(20)
            try await cluster.stop()
            try await send(20)
            #expect(statuses[503, default: 0] >= 20, "every request during the outage is refused: \(statuses)")
            try await cluster.startAgain()
            // Recovers on its own: within a bounded time requests succeed again.
            try await waitUntil("a notification is stored again", timeout: .seconds(20), every: .milliseconds(200)) {
                let jti = "after-\(UUID().uuidString)"
                guard try await HTTP.request("POST", path, body: TestAppleKeys.body(try keys.sign(TestAppleKeys.claims(jti: jti)))).status == 200
                else { return false }
                accepted.append(jti)
                return true
            }
            try await send(20)

            let check = try await PostgresConnection.connect(to: cluster.url, logger: TestDatabase.logger)
            defer { check.close() }
            let stored = try await check.query("SELECT jti FROM siwa.notifications").map { try $0.decode(String.self, column: "jti") }
            #expect(Set(accepted).isSubset(of: Set(stored)), "every 200 is in the table")
            #expect(accepted.count >= 41)
        }
    }

    @Test func badConfigurationExitsWithStatus2AndOneLine() async throws {
        let cases: [([String: String], String)] = [
            (["SIWA_CLIENT_IDS": "a"], "DATABASE_URL"),
            (["DATABASE_URL": "postgresql://x@127.0.0.1:1/x"], "SIWA_CLIENT_IDS"),
            (["DATABASE_URL": "postgresql://x@127.0.0.1:1/x", "SIWA_CLIENT_IDS": "a", "SIWA_LISTEN": "nope"], "SIWA_LISTEN"),
            (["DATABASE_URL": "postgresql://x@127.0.0.1:1/x", "SIWA_CLIENT_IDS": "a", "SIWA_LOG_LEVEL": "loud"], "SIWA_LOG_LEVEL"),
        ]
        for (environment, variable) in cases {
            let process = try ServiceProcess("siwa-receiver", environment: environment)
            let status = await process.waitForExit()
            #expect(status == 2, "\(variable): exit \(status.map(String.init) ?? "none") \(process.terminationReason)\n\(process.log)")
            let lines = process.log.split(separator: "\n")
            #expect(lines.count == 1 && lines[0].contains(variable), "\(process.log)")
        }
    }
}
