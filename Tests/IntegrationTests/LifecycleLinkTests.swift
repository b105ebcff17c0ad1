import AppleClient
import FakeApple
import Foundation
import JobQueue
import Postgres
import Testing
import StoredTokens

@Suite(.serialized) struct LifecycleLinkTests {
    @Test func linkHappyPath() async throws {
        try await withLifecycle { h in
            let code = h.fake.registerCode(clientID: LifecycleHarness.clientID, sub: "001.alice", email: "a@privaterelay.appleid.com", isPrivateEmail: true)
            let jobID = try await h.link(sub: "001.alice", appUserID: "app-42", code: code)
            #expect(try await h.run(jobID) == .completedByHandler)

            let row = try await h.connection.query(
                "SELECT status, app_user_id, email, is_private_email, linked_at FROM siwa.accounts WHERE sub = '001.alice'")[0]
            #expect(try row.decode(String.self, column: "status") == "active")
            #expect(try row.decode(String.self, column: "app_user_id") == "app-42")
            #expect(try row.decode(String?.self, column: "email") == "a@privaterelay.appleid.com")
            #expect(try row.decode(Bool?.self, column: "is_private_email") == true)
            #expect(try row.decode(Date?.self, column: "linked_at") != nil)

            // The stored token is the one Apple issued, encrypted for this row.
            let issued = h.fake.refreshTokens(clientID: LifecycleHarness.clientID, sub: "001.alice")
            let stored = try #require(try await h.storedToken("001.alice"))
            #expect(issued == [try h.tokenBox.open(stored, clientID: LifecycleHarness.clientID, sub: "001.alice")])
            #expect(!String(decoding: stored, as: UTF8.self).contains(issued[0]))

            let job = try await h.jobRow(jobID)
            #expect(job.state == "completed" && job.outcome == "linked")
            #expect(!job.args.contains("code") && job.args.contains("app-42"))
            #expect(try await h.changes("001.alice").map(\.change) == ["linked"])
            let call = try #require(h.fake.calls.last { $0.endpoint == "token" })
            #expect(call.endpoint == "token" && call.status == 200 && call.validClientSecret && call.grantType == "authorization_code")
        }
    }

    @Test func reusedCodeFailsTheLink() async throws {
        try await withLifecycle { h in
            let code = h.fake.registerCode(clientID: LifecycleHarness.clientID, sub: "001.bob")
            #expect(try await h.run(try await h.link(sub: "001.bob", code: code)) == .completedByHandler)
            // The same code again, for another sub: Apple answers invalid_grant.
            let second = try await h.link(sub: "001.carol", code: code)
            #expect(try await h.run(second) == .completedByHandler)
            #expect(try await h.status("001.carol") == nil)
            #expect(try await h.storedToken("001.carol") == nil)
            let changes = try await h.changes("001.carol")
            #expect(changes.map(\.change) == ["link_failed"] && changes[0].reason == "invalid_grant")
            let job = try await h.jobRow(second)
            #expect(job.state == "completed" && job.outcome == "link_failed" && !job.args.contains("code"))
            #expect(h.fake.calls.last?.error == "invalid_grant")
        }
    }

    @Test func subMismatchFailsTheLink() async throws {
        try await withLifecycle { h in
            let code = h.fake.registerCode(clientID: LifecycleHarness.clientID, sub: "001.real")
            let jobID = try await h.link(sub: "001.claimed", code: code)
            #expect(try await h.run(jobID) == .completedByHandler)
            #expect(try await h.status("001.claimed") == nil)
            #expect(try await h.status("001.real") == nil)
            #expect(try await h.changes("001.claimed").first?.reason == "id_token_sub_mismatch")
            #expect(try await h.jobRow(jobID).args.contains("code") == false)
        }
    }

    @Test func badIDTokenSignatureFailsTheLink() async throws {
        try await withLifecycle { h in
            // An already active account must not lose its token or status to a forged answer.
            try await h.linkAccount(sub: "001.dave")
            let before = try await h.storedToken("001.dave")
            h.fake.injectFailures(endpoint: "token", responses: [.badSignature])
            let code = h.fake.registerCode(clientID: LifecycleHarness.clientID, sub: "001.dave")
            let jobID = try await h.link(sub: "001.dave", code: code)
            #expect(try await h.run(jobID) == .completedByHandler)
            #expect(try await h.changes("001.dave").last?.reason == "id_token_bad_signature")
            #expect(try await h.storedToken("001.dave") == before)
            #expect(try await h.jobRow(jobID).outcome == "link_failed")
        }
    }

    @Test func expiredCodeIsNotSentToApple() async throws {
        try await withLifecycle { h in
            let code = h.fake.registerCode(clientID: LifecycleHarness.clientID, sub: "001.erin")
            let jobID = try await h.link(sub: "001.erin", code: code)
            _ = try await h.connection.execute("UPDATE siwa.jobs SET created_at = now() - interval '6 minutes' WHERE id = \(jobID)")
            let calls = h.fake.calls.count
            #expect(try await h.run(jobID) == .completedByHandler)
            #expect(h.fake.calls.count == calls)
            #expect(try await h.changes("001.erin").first?.reason == "code_expired")
        }
    }

    @Test func retryableExchangeKeepsTheCode() async throws {
        try await withLifecycle { h in
            h.fake.injectFailures(endpoint: "token", responses: [.status(503)])
            let code = h.fake.registerCode(clientID: LifecycleHarness.clientID, sub: "001.fay")
            let jobID = try await h.link(sub: "001.fay", code: code)
            #expect(try await h.run(jobID) == .failed(error: "http_503"))
            #expect(try await h.jobRow(jobID).args.contains("code"))
            #expect(try await h.run(jobID) == .completedByHandler)
            #expect(try await h.status("001.fay") == "active")
        }
    }
}
