import AppleClient
import FakeApple
import Foundation
import JobQueue
import Logging
import Postgres
import Testing
import AppleJobs
import StoredTokens

@Suite(.serialized) struct LifecycleTokenTests {
    @Test func keyRotationReencryptsEveryRow() async throws {
        try await withLifecycle { h in
            for index in 0..<7 { try await h.linkAccount(sub: "001.u\(index)") }
            let old = h.tokenKeys
            let rotated = try TokenBox(configuration: TestSecrets.tokenKeys(["k2"]) + "," + old)
            let rotation = TokenKeyRotation(connection: h.connection, tokenBox: rotated, batchSize: 3)
            #expect(try await rotation.remaining() == 7)
            var progressCalls = 0
            let summary = try await rotation.run { _ in progressCalls += 1 }
            #expect(summary.reencrypted == 7 && summary.failed == 0)
            #expect(progressCalls == 3)
            #expect(try await rotation.remaining() == 0)
            for index in 0..<7 {
                let stored = try #require(try await h.storedToken("001.u\(index)"))
                #expect(TokenBox.keyID(of: stored) == "k2")
                let token = try rotated.open(stored, clientID: LifecycleHarness.clientID, sub: "001.u\(index)")
                #expect(h.fake.refreshTokens(clientID: LifecycleHarness.clientID, sub: "001.u\(index)") == [token])
            }
            // Resumable: a second run finds nothing to do.
            #expect(try await rotation.run().reencrypted == 0)
        }
    }

    @Test func copiedCiphertextDoesNotDecrypt() async throws {
        try await withLifecycle { h in
            try await h.linkAccount(sub: "001.victim")
            try await h.linkAccount(sub: "001.attacker")
            _ = try await h.connection.execute(
                """
                UPDATE siwa.accounts SET refresh_token_enc =
                       (SELECT refresh_token_enc FROM siwa.accounts WHERE sub = '001.victim')
                 WHERE sub = '001.attacker'
                """)
            let copied = try #require(try await h.storedToken("001.attacker"))
            #expect(throws: TokenBoxError.authenticationFailed) {
                try h.tokenBox.open(copied, clientID: LifecycleHarness.clientID, sub: "001.attacker")
            }
            // Deleting the attacker's account must not revoke the victim's token.
            let jobID = try await h.requestDeletion(sub: "001.attacker")
            #expect(try await h.run(jobID) == .failed(error: "token_undecryptable"))
            #expect(h.fake.calls.filter { $0.endpoint == "revoke" }.isEmpty)
            #expect(try await h.status("001.attacker") == "pending_deletion")
        }
    }

    @Test func importEncryptsAndReportsMalformedLines() async throws {
        try await withLifecycle { h in
            _ = try await h.connection.execute(
                "INSERT INTO siwa.accounts (client_id, sub, status) VALUES (\(LifecycleHarness.clientID), '001.gone', 'deleted')")
            let lines = [
                "client_id,sub,app_user_id,refresh_token",
                "\(LifecycleHarness.clientID),001.a,user-a,rtok-a-secret",
                "\(LifecycleHarness.clientID),001.b,,rtok-b-secret",
                "\(LifecycleHarness.clientID),001.c,user-c",  // malformed: no token
                "",
                "\(LifecycleHarness.clientID),001.gone,user-g,rtok-g-secret",  // deleted: left alone
            ]
            var progress: [Int] = []
            let importer = AccountImporter(connection: h.connection, tokenBox: h.tokenBox, progressInterval: 2) {
                progress.append($0.lines)
            }
            let summary = try await importer.run(lines: lines)
            #expect(summary.lines == 6 && summary.imported == 2 && summary.skipped == 1)
            #expect(summary.malformedLines == [4])
            #expect(progress == [2, 4, 6])
            #expect(try await h.status("001.a") == "active")
            let stored = try #require(try await h.storedToken("001.b"))
            #expect(try h.tokenBox.open(stored, clientID: LifecycleHarness.clientID, sub: "001.b") == "rtok-b-secret")
            #expect(try await h.status("001.gone") == "deleted")
            #expect(try await h.storedToken("001.gone") == nil)
            #expect(try await h.changes("001.a").map(\.change) == ["imported"])
        }
    }

    @Test func reconcileInvalidGrantRevokesConsent() async throws {
        try await withLifecycle { h in
            try await h.linkAccount(sub: "001.quiet")
            try await h.linkAccount(sub: "001.fine")
            // The user withdrew consent at Apple and we never heard: Apple's token is dead.
            let token = try #require(h.fake.refreshTokens(clientID: LifecycleHarness.clientID, sub: "001.quiet").first)
            _ = await h.context.client.revoke(refreshToken: token, clientID: LifecycleHarness.clientID)
            _ = try await h.connection.execute("UPDATE siwa.accounts SET token_checked_at = now() - interval '25 hours'")

            let scheduler = ReconcileScheduler(pool: h.pool, logger: h.logger, batchSize: 10)
            #expect(try await scheduler.queueBatch() == 2)
            #expect(try await scheduler.queueBatch() == 0)  // never two open jobs per account
            let jobs = try await h.connection.query(
                "SELECT id, sub FROM siwa.jobs WHERE kind = 'reconcile' ORDER BY sub"
            ).map { (try $0.decode(Int64.self, column: "id"), try $0.decode(String.self, column: "sub")) }
            #expect(jobs.map(\.1) == ["001.fine", "001.quiet"])
            #expect(try await h.run(jobs[0].0) == .completedByHandler)
            #expect(try await h.jobRow(jobs[0].0).outcome == "token_valid")
            #expect(try await h.run(jobs[1].0) == .completedByHandler)

            #expect(try await h.status("001.fine") == "active")
            #expect(try await h.status("001.quiet") == "consent_revoked")
            #expect(try await h.storedToken("001.quiet") == nil)
            #expect(try await h.scalar(Date.self, "SELECT sessions_revoked_at FROM siwa.accounts WHERE sub = '001.quiet'") != nil)
            let last = try #require(try await h.changes("001.quiet").last)
            #expect(last.change == "consent_revoked" && last.reason == "reconcile_invalid_grant")
            // Both were just checked: nothing to queue for a day.
            #expect(try await scheduler.queueBatch() == 0)
        }
    }

    /// Who is reconciled is one rule (siwa.reconcile_skip: reconcile's invalid_grant must apply, so
    /// only an active account holding a token not checked for a day), read the same by the
    /// schedule and by the job itself: a job queued for an account that has left `active` since, or
    /// whose token was checked meanwhile, asks Apple nothing.
    @Test func onlyActiveAccountsDueAreReconciled() async throws {
        try await withLifecycle { h in
            let statuses = ["active", "consent_revoked", "apple_account_deleted", "pending_deletion", "deleted"]
            for status in statuses {
                try await h.linkAccount(sub: "001.\(status)")
                _ = try await h.connection.execute(
                    "UPDATE siwa.accounts SET status = \(status), token_checked_at = now() - interval '25 hours' WHERE sub = \("001.\(status)")")
            }
            try await h.linkAccount(sub: "001.checked")  // checked just now, by its link
            let scheduler = ReconcileScheduler(pool: h.pool, logger: h.logger, batchSize: 10)
            #expect(try await scheduler.queueBatch() == 1)
            #expect(try await h.connection.query("SELECT sub FROM siwa.jobs WHERE kind = 'reconcile'").map {
                try $0.decode(String.self, at: 0)
            } == ["001.active"])

            // Jobs queued anyway (by hand, or before the account changed): each outcome says why not.
            var outcomes: [String: String] = [:]
            for sub in statuses.dropFirst().map({ "001.\($0)" }) + ["001.checked", "001.nobody"] {
                let id = try await h.connection.query(
                    "INSERT INTO siwa.jobs (kind, client_id, sub) VALUES ('reconcile', \(LifecycleHarness.clientID), \(sub)) RETURNING id"
                )[0].decode(Int64.self, at: 0)
                try await h.run(id)
                outcomes[sub] = try await h.jobRow(id).outcome ?? "none"
            }
            #expect(outcomes == [
                "001.consent_revoked": "skipped", "001.apple_account_deleted": "skipped", "001.pending_deletion": "skipped",
                "001.deleted": "skipped", "001.checked": "checked_recently", "001.nobody": "skipped",
            ])
            #expect(!h.fake.calls.contains { $0.grantType == "refresh_token" }, "Apple was asked about an account not due")
        }
    }

    @Test func logsNeverHoldSecrets() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("siwa-log-\(UUID().uuidString)").path
        let descriptor = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        #expect(descriptor >= 0)
        defer {
            close(descriptor)
            unlink(path)
        }
        let logger = Logger(label: "capture", level: .trace, sink: LogSink(fileDescriptor: descriptor))
        var secrets: [String] = []
        try await withLifecycle(logger: logger) { h in
            // A link, a failed link, retries, a pause, a deletion, a reconcile.
            let code = h.fake.registerCode(clientID: LifecycleHarness.clientID, sub: "001.log")
            secrets.append(code)
            h.fake.injectFailures(endpoint: "token", responses: [.status(503), .status(429)], retryAfter: "1")
            let link = try await h.link(sub: "001.log", code: code)
            for _ in 0..<3 { try await h.run(link) }
            #expect(try await h.status("001.log") == "active")
            let reused = try await h.link(sub: "001.log2", code: code)
            try await h.run(reused)
            secrets += h.fake.refreshTokens(clientID: LifecycleHarness.clientID, sub: "001.log")

            let deletion = try await h.requestDeletion(sub: "001.log")
            h.fake.injectFailures(endpoint: "revoke", responses: [.timeout, .oauthError("invalid_client")])
            try await h.run(deletion)
            try await h.run(deletion)
            _ = try await h.connection.execute("UPDATE siwa.paused_clients SET next_probe_at = now() - interval '1 second'")
            try await h.run(deletion)
            #expect(try await h.status("001.log") == "deleted")
        }
        let text = try String(contentsOfFile: path, encoding: .utf8)
        #expect(text.split(separator: "\n").count > 5)  // the capture worked
        for secret in secrets { #expect(!text.contains(secret)) }
        // No JWT of any kind: client_secret, id_token.
        #expect(!text.contains("eyJ"))
        #expect(!text.contains("client_secret="))
    }
}
