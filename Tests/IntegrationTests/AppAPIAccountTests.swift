import Foundation
import Postgres
import Testing
import TestTiming

/// The app API's account endpoints: state, app user id, deletion, the change feed.
@Suite(.serialized) struct AppAPIAccountTests {
    static let clientID = LifecycleHarness.clientID

    @Test func accountStateAndAppUserID() async throws {
        try await withAppAPI { api in
            let missing = try await api.request("GET", "/v1/accounts/\(Self.clientID)/001.nobody")
            #expect(missing.status == 404 && missing.error == "account_not_found")
            let patchMissing = try await api.request("PATCH", "/v1/accounts/\(Self.clientID)/001.nobody", body: ["app_user_id": "x"])
            #expect(patchMissing.status == 404 && patchMissing.error == "account_not_found")

            try await api.signedIn(sub: "001.acct")
            let account = try await api.request("GET", "/v1/accounts/\(Self.clientID)/001.acct")
            #expect(account.status == 200)
            #expect(account.json["status"] as? String == "active" && account.json["has_refresh_token"] as? Bool == true)
            #expect(account.json["refresh_token_enc"] == nil && !account.body.contains("\"refresh_token"))
            #expect(account.json["app_user_id"] is NSNull && account.json["linked_at"] is String)

            let patched = try await api.request("PATCH", "/v1/accounts/\(Self.clientID)/001.acct", body: ["app_user_id": "user-7"])
            #expect(patched.status == 200 && patched.json["app_user_id"] as? String == "user-7")
            #expect(try await api.lifecycle.scalar(String.self, "SELECT app_user_id FROM siwa.accounts WHERE sub = '001.acct'") == "user-7")
            // Answers are written by the API's own JSON writer: every character an app may store
            // comes back as it went in (quotes, backslash, controls, slash, non-ASCII), in a body
            // any JSON reader parses, with its members in key order.
            let awkward = "a\"b\\c/d\u{01}\n\t\r\u{1F}é€😀 end"
            let stored = try await api.request("PATCH", "/v1/accounts/\(Self.clientID)/001.acct", body: ["app_user_id": awkward])
            #expect(stored.status == 200 && stored.json["app_user_id"] as? String == awkward, "\(stored.body)")
            #expect(stored.body.contains(#""a\"b\\c/d\u0001\n\t\r\u001fé€😀 end""#), "\(stored.body)")
            let keys = ["app_user_id", "client_id", "email", "email_forwarding", "has_refresh_token", "is_private_email",
                "linked_at", "sessions_revoked_at", "status", "sub", "updated_at"]
            let positions = keys.map { stored.body.range(of: "\"\($0)\":")?.lowerBound }
            #expect(positions.allSatisfy { $0 != nil } && positions.map { $0! } == positions.map { $0! }.sorted(), "\(stored.body)")
            #expect(try await api.request("PATCH", "/v1/accounts/\(Self.clientID)/001.acct", body: ["app_user_id": 7]).status == 400)
            #expect(try await api.request("PATCH", "/v1/accounts/\(Self.clientID)/001.acct", body: ["other": "x"]).status == 400)
        }
    }

    @Test func deletionIsQueuedOnceAndSignInIsRefusedMeanwhile() async throws {
        try await withAppAPI { api in
            try await api.signedIn(sub: "001.gone")
            let first = try await api.request("POST", "/v1/accounts/\(Self.clientID)/001.gone/deletion")
            #expect(first.status == 202 && first.json["status"] as? String == "pending_deletion")
            let job = try #require(first.json["job_id"] as? Int)
            let again = try await api.request("POST", "/v1/accounts/\(Self.clientID)/001.gone/deletion", body: [:])
            #expect(again.status == 202 && again.json["job_id"] as? Int == job, "a repeat returns the same job")
            #expect(try await api.signIn(sub: "001.gone").error == "account_deleting")
            try await api.lifecycle.run(Int64(job))
            let account = try await api.request("GET", "/v1/accounts/\(Self.clientID)/001.gone")
            #expect(account.json["status"] as? String == "deleted" && account.json["has_refresh_token"] as? Bool == false)
            #expect(try await api.request("POST", "/v1/accounts/\(Self.clientID)/001.gone/deletion", rawBody: Data("[".utf8)).status == 400)
            #expect(try await api.request("GET", "/v1/accounts/\(Self.clientID)/001.gone/deletion").status == 405)
        }
    }

    @Test func changeFeedPagesInOrder() async throws {
        try await withAppAPI { api in
            for sub in ["001.c1", "001.c2", "001.c3"] { try await api.signedIn(sub: sub) }
            _ = try await api.request("POST", "/v1/accounts/\(Self.clientID)/001.c2/deletion")
            let page = try await api.request("GET", "/v1/changes?limit=2")
            #expect(page.status == 200)
            let changes = try #require(page.json["changes"] as? [[String: Any]])
            #expect(changes.map { $0["sub"] as? String } == ["001.c1", "001.c2"])
            #expect(changes.allSatisfy { $0["change"] as? String == "linked" && $0["status"] as? String == "active" })
            let next = try #require(page.json["next"] as? Int)
            #expect(next == changes.last?["id"] as? Int)
            let rest = try await api.request("GET", "/v1/changes?after=\(next)")
            let more = try #require(rest.json["changes"] as? [[String: Any]])
            #expect(more.map { $0["change"] as? String } == ["linked", "deletion_requested"])
            #expect(more.last?["status"] as? String == "pending_deletion" && more.last?["created_at"] is String)
            let end = try await api.request("GET", "/v1/changes?after=\(try #require(rest.json["next"] as? Int))")
            #expect((end.json["changes"] as? [Any])?.isEmpty == true && end.json["next"] as? Int == rest.json["next"] as? Int)
            for bad in ["limit=0", "limit=1001", "after=-1", "after=x", "limit=ten"] {
                #expect(try await api.request("GET", "/v1/changes?\(bad)").status == 400, "\(bad)")
            }
        }
    }

    /// Change ids are taken when a row is written, not when its transaction commits: a transaction
    /// that took the smaller id can commit after one that took a larger id. A reader paging by
    /// `after` must not be handed the larger id while the smaller one may still commit, or it
    /// passes it for good and never hears of that change (here: a deletion request).
    @Test func aChangeCommittedAfterALargerIDIsNotSkippedByTheFeed() async throws {
        try await withAppAPI { api in
            let (start, app) = try await Self.signedIn(api, ["001.slow", "001.fast"])
            defer { app.close() }
            // The app's transaction takes the next id and stays open; another commits the one after.
            _ = try await app.execute("BEGIN")
            _ = try await app.execute("SELECT siwa.request_deletion(\(Self.clientID), '001.slow')")
            _ = try await api.request("POST", "/v1/accounts/\(Self.clientID)/001.fast/deletion")

            let meanwhile = try await api.request("GET", "/v1/changes?after=\(start)")
            #expect(meanwhile.status == 200)
            let seen = try #require(meanwhile.json["changes"] as? [[String: Any]])
            #expect(seen.isEmpty, "a larger id served while a smaller one may still commit: \(meanwhile.body)")
            let next = try #require(meanwhile.json["next"] as? Int)

            _ = try await app.execute("COMMIT")
            let after = try await api.request("GET", "/v1/changes?after=\(next)")
            let changes = try #require(after.json["changes"] as? [[String: Any]])
            #expect(changes.map { $0["sub"] as? String } == ["001.slow", "001.fast"], "\(after.body)")
            #expect(changes.allSatisfy { $0["change"] as? String == "deletion_requested" })
        }
    }

    /// Within its wait, the feed serves what the open transaction commits, in id order, and nothing
    /// before it has. (A reader in a snapshot fixed for its transaction gets only the gap-free run.)
    @Test func theFeedWaitsForAWriterStillRunningThenServesBothInOrder() async throws {
        try await withAppAPI { api in
            let (start, app) = try await Self.signedIn(api, ["001.w1", "001.w2"])
            let reader = try await PostgresConnection.connect(to: api.lifecycle.database.url, logger: TestDatabase.logger)
            defer { app.close(); reader.close() }
            _ = try await app.execute("BEGIN")
            _ = try await app.execute("SELECT siwa.request_deletion(\(Self.clientID), '001.w1')")
            _ = try await api.request("POST", "/v1/accounts/\(Self.clientID)/001.w2/deletion")

            _ = try await reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            let fixed = try await reader.query("SELECT sub FROM siwa.account_changes_after(\(start), 10, '0 s')")
            #expect(fixed.isEmpty, "a fixed snapshot gets only the gap-free run after the cursor")
            _ = try await reader.execute("COMMIT")

            let pid = try #require(try await reader.query("SELECT pg_backend_pid()").first?.decode(Int32.self, at: 0))
            let page = Task { try await reader.query("SELECT sub FROM siwa.account_changes_after(\(start), 10, '60 s')").map { try $0.decode(String.self, at: 0) } }
            // Commit only once the reader is waiting, so the page can only be right by waiting.
            try await waitUntil("the feed waits", timeout: .seconds(60), every: .milliseconds(5)) {
                try await api.lifecycle.scalar(String.self, "SELECT wait_event FROM pg_stat_activity WHERE pid = \(pid)") == "PgSleep"
            }
            _ = try await app.execute("COMMIT")
            #expect(try await page.value == ["001.w1", "001.w2"])
        }
    }

    /// A change id that never commits (a rolled-back transaction) leaves a gap for good: the feed
    /// goes past it once nothing that could fill it is still running.
    @Test func aRolledBackChangeLeavesAGapTheFeedGoesPast() async throws {
        try await withAppAPI { api in
            let (start, app) = try await Self.signedIn(api, ["001.undone", "001.kept"])
            defer { app.close() }
            _ = try await app.execute("BEGIN")
            _ = try await app.execute("SELECT siwa.request_deletion(\(Self.clientID), '001.undone')")
            _ = try await app.execute("ROLLBACK")
            _ = try await api.request("POST", "/v1/accounts/\(Self.clientID)/001.kept/deletion")
            let page = try await api.request("GET", "/v1/changes?after=\(start)")
            let changes = try #require(page.json["changes"] as? [[String: Any]])
            #expect(changes.map { $0["sub"] as? String } == ["001.kept"], "\(page.body)")
            #expect(page.json["next"] as? Int == changes.last?["id"] as? Int)
        }
    }

    /// Signs `subs` in; returns the newest change id then and a connection of its own for an app
    /// transaction.
    private static func signedIn(_ api: AppAPIHarness, _ subs: [String]) async throws -> (Int64, PostgresConnection) {
        for sub in subs { try await api.signedIn(sub: sub) }
        let start = try #require(try await api.lifecycle.scalar(Int64.self, "SELECT max(id) FROM siwa.account_changes"))
        return (start, try await PostgresConnection.connect(to: api.lifecycle.database.url, logger: TestDatabase.logger))
    }
}
