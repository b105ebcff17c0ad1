import AppleClient
import FakeApple
import Foundation
import JobQueue
import Postgres
import Testing
import TestTiming

@Suite(.serialized) struct LifecycleDeletionTests {
    @Test func deletionHappyPath() async throws {
        try await withLifecycle { h in
            try await h.linkAccount(sub: "001.alice")
            let token = try #require(h.fake.refreshTokens(clientID: LifecycleHarness.clientID, sub: "001.alice").first)
            // A notification with personal data, to be erased.
            _ = try await h.connection.execute(
                """
                INSERT INTO siwa.notifications (jti, client_id, sub, event_type, event_time, email, claims, jws, processed_at, outcome)
                VALUES ('n-email', \(LifecycleHarness.clientID), '001.alice', 'email-enabled', now(), 'a@x.example',
                        '{"events":"{}"}', 'h.p.s', now(), 'applied')
                """)
            let jobID = try await h.requestDeletion(sub: "001.alice")
            #expect(try await h.requestDeletion(sub: "001.alice") == jobID)
            #expect(try await h.run(jobID) == .completedByHandler)

            #expect(try await h.status("001.alice") == "deleted")
            #expect(try await h.storedToken("001.alice") == nil)
            #expect(try await h.scalar(String.self, "SELECT email FROM siwa.accounts WHERE sub = '001.alice'") == nil)
            #expect(try await h.scalar(String.self, "SELECT jws FROM siwa.notifications WHERE jti = 'n-email'") == nil)
            #expect(try await h.scalar(String.self, "SELECT email FROM siwa.notifications WHERE jti = 'n-email'") == nil)
            #expect(try await h.changes("001.alice").map(\.change) == ["linked", "deletion_requested", "deleted"])
            #expect(try await h.jobRow(jobID).outcome == "deleted")
            let revoke = try #require(h.fake.calls.last)
            #expect(revoke.endpoint == "revoke" && revoke.status == 200 && revoke.validClientSecret)
            #expect(h.fake.isRevoked(refreshToken: token) == true)

            // Apple answers our revoke with consent-revoked: it changes nothing.
            _ = try await h.connection.execute(
                """
                INSERT INTO siwa.notifications (jti, client_id, sub, event_type, event_time, claims)
                VALUES ('n-revoked', \(LifecycleHarness.clientID), '001.alice', 'consent-revoked', now(), '{}')
                """)
            #expect(try await h.scalar(String.self, "SELECT siwa.apply_notification('n-revoked', NULL)") == "ignored_account_deleted")
            #expect(try await h.status("001.alice") == "deleted")
            #expect(try await h.changes("001.alice").count == 3)
        }
    }

    @Test func deletionWithoutTokenSkipsApple() async throws {
        try await withLifecycle { h in
            let jobID = try await h.requestDeletion(sub: "001.never-linked")
            #expect(try await h.run(jobID) == .completedByHandler)
            #expect(try await h.status("001.never-linked") == "deleted")
            #expect(h.fake.calls.filter { $0.endpoint == "revoke" }.isEmpty)
            #expect(try await h.jobRow(jobID).outcome == "deleted_without_token")
        }
    }

    @Test func relinkSupersedesThePendingRevoke() async throws {
        try await withLifecycle { h in
            try await h.linkAccount(sub: "001.bob")
            let jobID = try await h.requestDeletion(sub: "001.bob")
            _ = try await h.connection.execute("UPDATE siwa.accounts SET status = 'active' WHERE sub = '001.bob'")
            #expect(try await h.run(jobID) == .completedByHandler)
            #expect(try await h.jobRow(jobID).outcome == "superseded")
            #expect(try await h.status("001.bob") == "active")
        }
    }

    @Test func threeServiceUnavailableThenSuccess() async throws {
        try await withLifecycle { h in
            try await h.linkAccount(sub: "001.carol")
            let jobID = try await h.requestDeletion(sub: "001.carol")
            h.fake.injectFailures(endpoint: "revoke", responses: [.status(503), .status(503), .status(503)])
            for _ in 0..<3 {
                #expect(try await h.run(jobID) == .failed(error: "http_503"))
                #expect(try await h.status("001.carol") == "pending_deletion")
            }
            #expect(try await h.run(jobID) == .completedByHandler)
            #expect(try await h.status("001.carol") == "deleted")
            #expect(h.fake.calls.filter { $0.endpoint == "revoke" }.map(\.status) == [503, 503, 503, 200])
            #expect(try await h.scalar(Int.self, "SELECT jsonb_array_length(errors) FROM siwa.jobs WHERE id = \(jobID)") == 3)
        }
    }

    @Test func rateLimitHonoursRetryAfter() async throws {
        try await withLifecycle { h in
            try await h.linkAccount(sub: "001.dan")
            let jobID = try await h.requestDeletion(sub: "001.dan")
            h.fake.injectFailures(endpoint: "revoke", responses: [.status(429)], retryAfter: "2")
            #expect(try await h.run(jobID) == .failed(error: "rate_limited", retryAfter: .seconds(2)))
            h.fake.injectFailures(endpoint: "revoke", responses: [.status(429)], retryAfter: "Wed, 21 Oct 2015 07:28:00 GMT")
            #expect(try await h.run(jobID) == .failed(error: "rate_limited", retryAfter: .seconds(0)))
            #expect(try await h.run(jobID) == .completedByHandler)
        }
    }

    @Test func hangingAppleTimesOutWithinTheBound() async throws {
        try await withLifecycle { h in  // Apple calls bounded at 5 s; the injected hang lasts 30 s (both times TestTimeScale)
            try await h.linkAccount(sub: "001.eve")
            let jobID = try await h.requestDeletion(sub: "001.eve")
            h.fake.injectFailures(endpoint: "revoke", responses: [.timeout])
            let clock = ContinuousClock()
            let start = clock.now
            let result = try await h.run(jobID)
            let elapsed = clock.now - start
            #expect(result == .failed(error: "timeout"))
            // The 5 s bound plus the job's own queries; unbounded is 30 s (all times TestTimeScale).
            #expect(elapsed < TestTimeScale.scaled(.seconds(15)))
            #expect(try await h.status("001.eve") == "pending_deletion")
        }
    }

    @Test func invalidClientPausesAndProbeResumes() async throws {
        try await withLifecycle { h in
            try await h.linkAccount(sub: "001.finn")
            try await h.linkAccount(sub: "001.gail")
            let first = try await h.requestDeletion(sub: "001.finn")
            let second = try await h.requestDeletion(sub: "001.gail")
            h.fake.injectFailures(endpoint: "revoke", responses: [.oauthError("invalid_client")])
            guard case .snoozed = try await h.run(first) else { Issue.record("expected a snooze"); return }
            #expect(try await h.scalar(String.self, "SELECT reason FROM siwa.paused_clients WHERE client_id = \(LifecycleHarness.clientID)") == "invalid_client")
            // While paused no call goes to Apple and no attempt is burned.
            let calls = h.fake.calls.count
            guard case .snoozed = try await h.run(second) else { Issue.record("expected a snooze"); return }
            #expect(h.fake.calls.count == calls)
            #expect(try await h.scalar(Int.self, "SELECT attempt FROM siwa.jobs WHERE id = \(second)") == 0)
            #expect(try await h.status("001.finn") == "pending_deletion")

            // Probe time: one job goes through, succeeds, and the client is resumed.
            _ = try await h.connection.execute("UPDATE siwa.paused_clients SET next_probe_at = now() - interval '1 second'")
            #expect(try await h.run(first) == .completedByHandler)
            #expect(try await h.scalar(Int.self, "SELECT count(*) FROM siwa.paused_clients") == 0)
            #expect(try await h.run(second) == .completedByHandler)
            #expect(try await h.status("001.finn") == "deleted")
            #expect(try await h.status("001.gail") == "deleted")
        }
    }
}
