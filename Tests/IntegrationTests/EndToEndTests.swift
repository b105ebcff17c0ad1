import AppleClient
import FakeApple
import Foundation
import Postgres
import Testing
import WorkerCore
import Settings
import StoredTokens

/// The lifecycle through real processes: `siwa fake-apple`, `siwa-receiver`, `siwa-worker` (its real
/// executor, retry policy and pause bookkeeping), the app-facing SQL, `siwa simulate`, `siwa status`.
/// One stack per scenario (one at a time), so a failure in one does not hide the others; each checks that no
/// code, refresh token or JWT it handled reached any process's log.
@Suite(.serialized) struct EndToEndTests {
    static let clientID = EndToEndStack.clientID

    /// A link, a deletion requested twice, Apple's follow-up notification, and what the app's
    /// LISTEN siwa_account_changes received along the way.
    @Test func linkThenDeleteThenApplesFollowUp() async throws {
        try await withStack { stack, db, tokenBox, secrets in
            let listener = try await stack.database.connect()
            defer { listener.close() }
            try await listener.listen("siwa_account_changes")
            // (a) The app links: code from the fake, siwa.link_account, the worker exchanges it.
            let sub = "000111.e2e.0001"
            secrets.refreshTokens.append(try await link(sub, stack, db, tokenBox, &secrets))
            let tokenCalls = try await stack.calls().filter { $0.endpoint == "token" }
            #expect(tokenCalls.count == 1)
            #expect(tokenCalls.first?.status == 200)
            #expect(tokenCalls.first?.validClientSecret == true, "the fake checked the client_secret against the .p8")

            // (b) The app deletes: the same job twice; one revoke at Apple; then Apple's follow-up.
            let first = try await requestDeletion(sub, db)
            let second = try await requestDeletion(sub, db)
            #expect(first == second)
            try await db.waitForStatus(sub, "deleted")
            let revokes = try await stack.calls().filter { $0.endpoint == "revoke" }
            #expect(revokes.count == 1)
            #expect(revokes.first?.status == 200 && revokes.first?.validClientSecret == true)
            #expect(try await token(sub, db) == nil)

            let arguments = [
                "simulate", "consent-revoked", "--sub", sub, "--client-id", Self.clientID, "--receiver-url", stack.endpoint,
                "--fake-apple-url", stack.fakeURL,
            ]
            if stack.caFile != nil {
                // Without the CA the fake's certificate does not verify: one line naming the setting.
                let untrusted = try await Siwa.run(arguments, environment: [:])
                #expect(untrusted.status == 1 && untrusted.stderr.contains("(tls); set SIWA_CA_FILE"), "\(untrusted.stderr)")
            }
            let simulate = try await Siwa.run(arguments, environment: stack.trustEnvironment)
            #expect(simulate.status == 0, "\(simulate.stdout)\(simulate.stderr)")
            try await db.waitFor(
                "SELECT count(*) FROM siwa.notifications WHERE sub = \(sub) AND processed_at IS NOT NULL") { $0 == 1 }
            let outcome = try await db.query("SELECT outcome FROM siwa.notifications WHERE sub = \(sub)")[0]
                .decode(String?.self, at: 0)
            #expect(outcome == "ignored_account_deleted")
            #expect(try await db.int("SELECT count(*) FROM siwa.notifications WHERE sub = \(sub) AND jws IS NOT NULL") == 0,
                    "personal data of a deleted account is erased, also from the follow-up")
            #expect(try await status(sub, db) == "deleted")
            #expect(try await db.int("SELECT count(*) FROM siwa.jobs WHERE sub = \(sub) AND kind = 'revoke'") == 1, "no loop")

            // (f) What the app's LISTEN siwa_account_changes received.
            var payloads: [[String: Any]] = []
            while true {
                let batch = try await listener.waitForNotifications(timeout: .milliseconds(300))
                if batch.isEmpty { break }
                payloads += batch.compactMap { try? JSONSerialization.jsonObject(with: Data($0.payload.utf8)) as? [String: Any] }
            }
            let forFirst = payloads.filter { $0["sub"] as? String == sub }
            let changes = forFirst.compactMap { $0["change"] as? String }
            #expect(changes == ["linked", "deletion_requested", "deleted"], "\(forFirst)")
            let linked = forFirst.first { $0["change"] as? String == "linked" }
            #expect(linked?["status"] as? String == "active")
            // The payload names the change; the app reads the rest (app_user_id, reason) from the row.
            #expect(linked.map { Set($0.keys) } == ["id", "client_id", "sub", "change", "status"])
            let linkedID = try #require((linked?["id"] as? NSNumber)?.int64Value)
            #expect(
                try await db.query("SELECT app_user_id FROM siwa.account_changes WHERE id = \(linkedID)")[0]
                    .decode(String?.self, at: 0) == "user-\(sub)")
            #expect(linked?["client_id"] as? String == Self.clientID)
            #expect(forFirst.first { $0["change"] as? String == "deleted" }?["status"] as? String == "deleted")
            #expect(forFirst.allSatisfy { $0["id"] is NSNumber })
        }
    }

    /// (c) Revoke flapping through the real executor: 503 ×3, then success.
    @Test func revokeFlappingIsRetriedUntilAppleAccepts() async throws {
        try await withStack { stack, db, tokenBox, secrets in
            let flapping = "000111.e2e.0003"
            secrets.refreshTokens.append(try await link(flapping, stack, db, tokenBox, &secrets))
            try await stack.inject("revoke", [503, 503, 503])
            let flappingJob = try await requestDeletion(flapping, db)
            try await db.waitForStatus(flapping, "deleted")
            let errors = try await db.query(
                "SELECT jsonb_array_length(errors) AS n, state FROM siwa.jobs WHERE id = \(flappingJob)")[0]
            #expect(try errors.decode(Int.self, column: "n") == 3)
            #expect(try errors.decode(String.self, column: "state") == "completed")
            let flappingCalls = try await stack.calls().filter { $0.endpoint == "revoke" }.suffix(4).map(\.status)
            #expect(flappingCalls == [503, 503, 503, 200])
        }
    }

    /// (d) 429 with Retry-After: 1 is a floor under the (100 ms) backoff.
    @Test func rateLimitedRevokeWaitsForRetryAfter() async throws {
        try await withStack { stack, db, tokenBox, secrets in
            let limited = "000111.e2e.0004"
            secrets.refreshTokens.append(try await link(limited, stack, db, tokenBox, &secrets))
            try await stack.inject("revoke", [429], retryAfter: 1)
            let limitedJob = try await requestDeletion(limited, db)
            try await db.waitForStatus(limited, "deleted")
            let waited = try await db.query(
                """
                SELECT extract(epoch FROM finalized_at - (errors->0->>'at')::timestamptz)::float8 AS waited,
                       errors->0->>'error' AS error, jsonb_array_length(errors) AS n
                  FROM siwa.jobs WHERE id = \(limitedJob)
                """)[0]
            #expect(try waited.decode(String.self, column: "error") == "rate_limited")
            #expect(try waited.decode(Int.self, column: "n") == 1)
            #expect(try waited.decode(Double.self, column: "waited") >= 1.0)
            let limitedCalls = Array(try await stack.calls().filter { $0.endpoint == "revoke" }.suffix(2))
            #expect(limitedCalls.map(\.status) == [429, 200])
            if limitedCalls.count == 2 {
                #expect(limitedCalls[1].time.timeIntervalSince(limitedCalls[0].time) >= 0.95, "next attempt not before Retry-After")
            }
        }
    }

    /// (e) invalid_client pauses the client ID (siwa status shows it); a later success resumes it.
    @Test func invalidClientPausesTheClientIDUntilAppleAcceptsAgain() async throws {
        try await withStack { stack, db, tokenBox, secrets in
            let paused = "000111.e2e.0005"
            secrets.refreshTokens.append(try await link(paused, stack, db, tokenBox, &secrets))
            try await stack.inject("revoke", Array(repeating: "invalid_client", count: 100))
            _ = try await requestDeletion(paused, db)
            try await db.waitFor("SELECT count(*) FROM siwa.paused_clients WHERE client_id = \(Self.clientID)") { $0 == 1 }
            let statusJSON = try await Siwa.run(["status", "--json"], environment: ["DATABASE_URL": stack.database.url])
            #expect(statusJSON.status == 0, "\(statusJSON.stderr)")
            let object = try JSONSerialization.jsonObject(with: Data(statusJSON.stdout.utf8)) as? [String: Any]
            let pausedClients = object?["paused_clients"] as? [[String: Any]] ?? []
            #expect(pausedClients.contains { ($0["client_id"] as? String) == Self.clientID }, "\(statusJSON.stdout)")
            #expect(try await status(paused, db) == "pending_deletion", "never dropped while paused")
            let statusText = try await Siwa.run(["status"], environment: ["DATABASE_URL": stack.database.url])
            #expect(statusText.stdout.contains("paused \(Self.clientID): invalid_client"), "\(statusText.stdout)")
            try await stack.inject("revoke", [])  // Apple accepts our credentials again
            try await db.waitForStatus(paused, "deleted")
            #expect(try await db.int("SELECT count(*) FROM siwa.paused_clients") == 0)

            // The real `siwa status` after all of it (the table form), for the record.
            let finalStatus = try await Siwa.run(["status"], environment: ["DATABASE_URL": stack.database.url])
            #expect(finalStatus.status == 0)
            print("siwa status after the end-to-end scenarios:\n\(finalStatus.stdout)")
        }
    }

    /// The two worker settings the scenarios shorten (defaults: the constants they replaced).
    @Test func retryBaseAndPauseProbeIntervalSettings() throws {
        let base = ["DATABASE_URL": "postgresql://x@127.0.0.1:1/x", "SIWA_CLIENT_IDS": "a", "SIWA_APPLE_CALLS": "disabled"]
        let defaults = try WorkerConfiguration(ConfigurationSource(arguments: [], environment: base))
        #expect(defaults.retryBase == .seconds(1))
        #expect(defaults.apple.pauseInterval == .seconds(300))
        let set = try WorkerConfiguration(
            ConfigurationSource(
                arguments: ["--siwa-retry-base", "250ms"], environment: base.merging(["SIWA_PAUSE_PROBE_INTERVAL": "2m"]) { $1 }))
        #expect(set.retryBase == .milliseconds(250))
        #expect(set.apple.pauseInterval == .seconds(120))
        for (variable, value) in [("SIWA_RETRY_BASE", "0"), ("SIWA_RETRY_BASE", "2h"), ("SIWA_PAUSE_PROBE_INTERVAL", "500ms")] {
            #expect(throws: ConfigurationError.self, "\(variable)=\(value)") {
                try WorkerConfiguration(ConfigurationSource(arguments: [], environment: base.merging([variable: value]) { $1 }))
            }
        }
    }

    /// Codes and refresh tokens seen during the run: none may appear in any log line.
    struct Secrets {
        var codes: [String] = []
        var refreshTokens: [String] = []
    }

    /// Runs `body` against a fresh stack and database, then stops the stack and checks its logs
    /// for the secrets `body` recorded; on failure prints each process's log tail.
    private func withStack(
        _ body: (EndToEndStack, PostgresConnection, TokenBox, inout Secrets) async throws -> Void
    ) async throws {
        let database = try await LifecycleHarness.makeDatabase()
        let stack: EndToEndStack
        do { stack = try await EndToEndStack(database: database) } catch {
            await database.drop()
            throw error
        }
        var secrets = Secrets()
        do {
            let db = try await database.connect()
            defer { db.close() }
            try await body(stack, db, try TokenBox(configuration: stack.tokenKeys), &secrets)
            await stack.stop()
            try checkLogs(stack, secrets)
        } catch {
            await stack.stop()
            for process in stack.processes { print("---- \(process.name) log ----\n\(process.log.suffix(6000))") }
            await database.drop()
            throw error
        }
        await database.drop()
    }

    // MARK: Steps

    /// Links `sub` through the real worker; returns the refresh token it stored (decrypted here).
    private func link(
        _ sub: String, _ stack: EndToEndStack, _ db: PostgresConnection, _ tokenBox: TokenBox, _ secrets: inout Secrets
    ) async throws -> String {
        let code = try await stack.code(sub: sub, email: "\(sub)@privaterelay.appleid.com")
        secrets.codes.append(code)
        let job = try await db.query(
            "SELECT siwa.link_account(\(Self.clientID), \(sub), \("user-\(sub)"), \(code))")[0].decode(Int64.self, at: 0)
        try await db.waitForStatus(sub, "active")
        let stored = try #require(try await token(sub, db))
        let refreshToken = try tokenBox.open(stored, clientID: Self.clientID, sub: sub)
        #expect(refreshToken.hasPrefix("r") && refreshToken.count == 49, "the fake's token shape")
        #expect(Data(stored).range(of: Data(refreshToken.utf8)) == nil, "stored encrypted, not in plaintext")
        let args = try await db.query("SELECT args::text FROM siwa.jobs WHERE id = \(job)")[0].decode(String.self, at: 0)
        #expect(!args.contains(code), "the spent code is removed from the job")
        return refreshToken
    }

    private func requestDeletion(_ sub: String, _ db: PostgresConnection) async throws -> Int64 {
        try await db.query("SELECT siwa.request_deletion(\(Self.clientID), \(sub))")[0].decode(Int64.self, at: 0)
    }

    private func status(_ sub: String, _ db: PostgresConnection) async throws -> String? {
        try await db.query("SELECT status FROM siwa.accounts WHERE client_id = \(Self.clientID) AND sub = \(sub)")
            .first?.decode(String.self, at: 0)
    }

    private func token(_ sub: String, _ db: PostgresConnection) async throws -> [UInt8]? {
        try await db.query(
            "SELECT refresh_token_enc FROM siwa.accounts WHERE client_id = \(Self.clientID) AND sub = \(sub)"
        ).first?.decode([UInt8]?.self, at: 0)
    }

    /// No authorization code, refresh token, client_secret or notification JWS in any log line.
    private func checkLogs(_ stack: EndToEndStack, _ secrets: Secrets) throws {
        #expect(!secrets.codes.isEmpty && secrets.codes.count == secrets.refreshTokens.count)
        for process in stack.processes {
            let log = process.log
            #expect(!log.isEmpty, "\(process.name) wrote no log")
            for code in secrets.codes { #expect(!log.contains(code), "\(process.name) logged an authorization code") }
            for token in secrets.refreshTokens { #expect(!log.contains(token), "\(process.name) logged a refresh token") }
            // Every JWT (client_secret, id_token, notification JWS) starts with a base64url `{"`.
            let jwtLines = log.split(separator: "\n").filter { $0.contains("eyJ") }
            #expect(jwtLines.isEmpty, "\(process.name) logged a JWT-looking string: \(jwtLines.prefix(3))")
        }
        #expect(stack.worker.log.contains("account linked"))
    }
}
