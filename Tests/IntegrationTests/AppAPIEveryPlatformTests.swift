import AppleClient
import FakeApple
import Foundation
import Postgres
import Testing
import StoredTokens

/// Sign-in on every platform (Sources/AppAPI/README.md, `POST /v1/sign-in`), against a real PostgreSQL
/// and the fake Apple: web codes and their redirect URI, the user's name and `real_user_status`,
/// their erasure, a code at every sign-in, deletion's answers, and input the database cannot hold.
@Suite(.serialized) struct AppAPIEveryPlatformTests {
    static let clientID = LifecycleHarness.clientID
    static let redirectURI = "https://app.example.com/auth/apple/callback"

    /// What the web page gets from Apple (a Services ID's flow): a code bound to its redirect URI.
    static func webSignIn(_ api: AppAPIHarness, sub: String, realUserStatus: Int? = nil) async throws -> [String: Any] {
        let nonce = try await api.nonce()
        let apple = api.fake.issueIdentityToken(
            clientID: clientID, sub: sub, nonce: IdentityTokenVerifier.nonceClaim(rawNonce: nonce), email: "w@example.com",
            isPrivateEmail: false, redirectURI: redirectURI, realUserStatus: realUserStatus)
        return [
            "client_id": clientID, "identity_token": apple.identityToken, "nonce": nonce,
            "authorization_code": apple.authorizationCode, "redirect_uri": redirectURI,
        ]
    }

    @Test func aWebCodeIsExchangedWithItsRedirectURIAndRefusedWithAnother() async throws {
        try await withAppAPI { api in
            // Another redirect URI (or none): Apple refuses the code, nothing is created.
            for other in ["https://app.example.com/other", nil] as [String?] {
                var body = try await Self.webSignIn(api, sub: "001.web")
                body["redirect_uri"] = other
                let refused = try await api.request("POST", "/v1/sign-in", body: body)
                #expect(refused.status == 400 && refused.error == "code_invalid", "\(refused.body)")
                #expect(try await api.lifecycle.status("001.web") == nil)
            }
            let answer = try await api.request("POST", "/v1/sign-in", body: try await Self.webSignIn(api, sub: "001.web"))
            #expect(answer.status == 200, "\(answer.body)")
            #expect(answer.json["has_refresh_token"] as? Bool == true && answer.json["new"] as? Bool == true)
            #expect(api.fake.refreshTokens(clientID: Self.clientID, sub: "001.web").count == 1)
        }
    }

    @Test func theNameIsKeptAcrossASignInWithoutIt() async throws {
        try await withAppAPI { api in
            var first = try await Self.webSignIn(api, sub: "001.named")
            first["full_name"] = ["given_name": "Ada", "family_name": "Lovelace", "nickname": NSNull()]
            let signedIn = try await api.request("POST", "/v1/sign-in", body: first)
            #expect(signedIn.status == 200, "\(signedIn.body)")
            #expect(signedIn.json["full_name"] as? [String: String] == ["given_name": "Ada", "family_name": "Lovelace"])

            // Later authorizations carry no name (native: empty components): the stored one stays.
            for name in [nil, [:], ["given_name": NSNull()]] as [[String: Any]?] {
                var again = try await Self.webSignIn(api, sub: "001.named")
                if let name { again["full_name"] = name }
                let answer = try await api.request("POST", "/v1/sign-in", body: again)
                #expect(answer.status == 200 && answer.json["full_name"] as? [String: String] == ["given_name": "Ada", "family_name": "Lovelace"])
            }
            let account = try await api.request("GET", "/v1/accounts/\(Self.clientID)/001.named")
            #expect(account.json["full_name"] as? [String: String] == ["given_name": "Ada", "family_name": "Lovelace"])
            let view = try #require(
                try await api.lifecycle.scalar(String.self, "SELECT full_name::text FROM siwa.account(\(Self.clientID), '001.named')"))
            #expect(view.contains("Lovelace"))

            // Too long a member: 400 naming the member, never its value.
            var long = try await Self.webSignIn(api, sub: "001.named")
            long["full_name"] = ["family_name": String(repeating: "L", count: 257)]
            let refused = try await api.request("POST", "/v1/sign-in", body: long)
            #expect(refused.status == 400 && refused.error == "bad_request")
            #expect((refused.json["detail"] as? String)?.contains("full_name.family_name") == true && !refused.body.contains("LLLL"))
        }
    }

    @Test func realUserStatusIsStoredAndShownByName() async throws {
        try await withAppAPI { api in
            for (value, name) in [(0, "unsupported"), (1, "unknown"), (2, "likely_real")] {
                let sub = "001.real\(value)"
                let answer = try await api.request("POST", "/v1/sign-in", body: try await Self.webSignIn(api, sub: sub, realUserStatus: value))
                #expect(answer.status == 200 && answer.json["real_user_status"] as? String == name, "\(answer.body)")
                // A later token without the claim keeps it.
                let again = try await api.request("POST", "/v1/sign-in", body: try await Self.webSignIn(api, sub: sub))
                #expect(again.json["real_user_status"] as? String == name)
                let account = try await api.request("GET", "/v1/accounts/\(Self.clientID)/\(sub)")
                #expect(account.json["real_user_status"] as? String == name)
            }
            let none = try await api.request("POST", "/v1/sign-in", body: try await Self.webSignIn(api, sub: "001.realnone"))
            #expect(none.json.keys.contains("real_user_status") && none.json["real_user_status"] is NSNull)
        }
    }

    @Test func theNameAndRealUserStatusAreErasedAtDeletedAndAppleAccountDeleted() async throws {
        try await withAppAPI { api in
            for sub in ["001.erase-deleted", "001.erase-apple"] {
                // A native sign-in (no redirect URI), with the name and the signal.
                let nonce = try await api.nonce()
                let apple = api.fake.issueIdentityToken(
                    clientID: Self.clientID, sub: sub, nonce: IdentityTokenVerifier.nonceClaim(rawNonce: nonce), realUserStatus: 2)
                let body: [String: Any] = [
                    "client_id": Self.clientID, "identity_token": apple.identityToken, "nonce": nonce,
                    "authorization_code": apple.authorizationCode, "full_name": ["given_name": "Grace"],
                ]
                #expect(try await api.request("POST", "/v1/sign-in", body: body).status == 200)
                let stored = try await api.lifecycle.scalar(
                    Int.self, "SELECT count(*)::int FROM siwa.accounts WHERE sub = \(sub) AND full_name IS NOT NULL AND real_user_status IS NOT NULL")
                #expect(stored == 1, "stored before")
            }
            let job = try await api.lifecycle.requestDeletion(sub: "001.erase-deleted")
            try await api.lifecycle.run(job)
            #expect(try await api.lifecycle.status("001.erase-deleted") == "deleted")

            _ = try await api.connection.execute(
                """
                INSERT INTO siwa.notifications (jti, client_id, sub, event_type, event_time, claims)
                VALUES ('n-erase', \(Self.clientID), '001.erase-apple', 'account-deleted', now() + interval '1 minute', '{}')
                """)
            #expect(try await api.lifecycle.scalar(String.self, "SELECT siwa.apply_notification('n-erase', NULL)") == "applied")
            #expect(try await api.lifecycle.status("001.erase-apple") == "apple_account_deleted")

            for sub in ["001.erase-deleted", "001.erase-apple"] {
                let left = try await api.lifecycle.scalar(
                    Int.self,
                    "SELECT count(*)::int FROM siwa.accounts WHERE sub = \(sub) AND (full_name IS NOT NULL OR real_user_status IS NOT NULL)")
                #expect(left == 0, "\(sub)")
                let account = try await api.request("GET", "/v1/accounts/\(Self.clientID)/\(sub)")
                #expect(account.json["full_name"] is NSNull && account.json["real_user_status"] is NSNull)
            }
        }
    }

    @Test func aCodeIsExchangedAlsoWhenATokenIsHeld() async throws {
        try await withAppAPI { api in
            try await api.signedIn(sub: "001.again")
            let first = try #require(api.fake.refreshTokens(clientID: Self.clientID, sub: "001.again").first)
            let again = try await api.signIn(sub: "001.again")
            #expect(again.status == 200 && again.json["new"] as? Bool == false)
            let tokens = api.fake.refreshTokens(clientID: Self.clientID, sub: "001.again")
            #expect(tokens.count == 2, "the second code was exchanged too")
            let current = try api.lifecycle.tokenBox.open(
                try #require(try await api.lifecycle.storedToken("001.again")), clientID: Self.clientID, sub: "001.again")
            #expect(current != first && tokens.contains(current), "the new token is current")
            #expect(try await api.lifecycle.heldTokenCount("001.again") == 2, "the earlier one is held for a deletion")

            // A deletion revokes both.
            let job = try await api.lifecycle.requestDeletion(sub: "001.again")
            try await api.lifecycle.run(job)
            #expect(tokens.allSatisfy { api.fake.isRevoked(refreshToken: $0) == true })
        }
    }

    @Test func aDeletionWithACodeAfterDeletedRevokesTheNewGrant() async throws {
        try await withAppAPI { api in
            try await api.signedIn(sub: "001.twice")
            let path = "/v1/accounts/\(Self.clientID)/001.twice/deletion"
            let first = try await api.request("POST", path)
            #expect(first.status == 202 && first.json["status"] as? String == "pending_deletion")
            try await api.lifecycle.run(try #require(first.json["job_id"] as? Int).int64)
            #expect(try await api.lifecycle.status("001.twice") == "deleted")

            // The user signed in with Apple again (not through the API); the app deletes with that code.
            let code = api.fake.registerCode(clientID: Self.clientID, sub: "001.twice")
            let second = try await api.request("POST", path, body: ["authorization_code": code])
            #expect(second.status == 202 && second.json["status"] as? String == "deleted", "the account's status: \(second.body)")
            let exchange = try #require(second.json["job_id"] as? Int).int64
            try await api.lifecycle.run(exchange)
            let late = try #require(
                try await api.lifecycle.scalar(
                    Int64.self, "SELECT max(id) FROM siwa.jobs WHERE sub = '001.twice' AND kind = 'revoke' AND args ? 'late_token'"))
            try await api.lifecycle.run(late)
            let obtained = try #require(api.fake.issuedTokens(clientID: Self.clientID, sub: "001.twice").first { $0.code == code })
            #expect(api.fake.isRevoked(refreshToken: obtained.token) == true, "the new grant is revoked at Apple")
            #expect(try await api.lifecycle.status("001.twice") == "deleted")
            #expect(try await api.lifecycle.heldTokenCount("001.twice") == 0)

            // Without a code on a deleted account: the same job, status deleted.
            let repeated = try await api.request("POST", path)
            #expect(repeated.status == 202 && repeated.json["status"] as? String == "deleted")
        }
    }

    @Test func aDeletionForAnUnknownAccountIs404AndCreatesNothing() async throws {
        try await withAppAPI { api in
            let answer = try await api.request("POST", "/v1/accounts/\(Self.clientID)/001.nobody/deletion")
            #expect(answer.status == 404 && answer.error == "account_not_found")
            #expect(try await api.lifecycle.status("001.nobody") == nil)
            #expect(try await api.lifecycle.changes("001.nobody").isEmpty)
            #expect(try await api.lifecycle.scalar(Int.self, "SELECT count(*)::int FROM siwa.jobs WHERE sub = '001.nobody'") == 0)
        }
    }

    /// A string PostgreSQL's text cannot hold, in each place a client can put one: 400, never 5xx.
    @Test func aNULCharacterIs400InEveryHandler() async throws {
        try await withAppAPI { api in
            try await api.signedIn(sub: "001.nul")
            let nul = "a\u{0}b"
            var signIn = try await Self.webSignIn(api, sub: "001.nul")
            signIn["redirect_uri"] = nul
            var named = try await Self.webSignIn(api, sub: "001.nul")
            named["full_name"] = ["given_name": nul]
            let cases: [(String, String, Any?)] = [
                ("POST", "/v1/sign-in", signIn), ("POST", "/v1/sign-in", named),
                ("POST", "/v1/sign-in", ["client_id": nul, "identity_token": "x", "nonce": "y"]),
                ("PATCH", "/v1/accounts/\(Self.clientID)/001.nul", ["app_user_id": nul]),
                ("POST", "/v1/accounts/\(Self.clientID)/001.nul/deletion", ["authorization_code": nul]),
            ]
            for (method, path, body) in cases {
                let answer = try await api.request(method, path, body: body)
                #expect(answer.status == 400 && answer.error == "bad_request", "\(method) \(path): \(answer.status) \(answer.body)")
                #expect(answer.json["detail"] is String, "\(method) \(path) names the rule")
            }
            #expect(try await api.lifecycle.status("001.nul") == "active", "nothing was changed")
            // Out of range: the change feed's cursor.
            let range = try await api.request("GET", "/v1/changes?after=99999999999999999999")
            #expect(range.status == 400 && (range.json["detail"] as? String)?.contains("after") == true)
        }
    }

    @Test func theOpenAPIDocumentDescribesEveryRouteAndNeedsTheBearer() async throws {
        try await withAppAPI { api in
            #expect(try await api.request("GET", "/v1/openapi.json", bearer: nil).status == 401)
            let answer = try await api.request("GET", "/v1/openapi.json")
            #expect(answer.status == 200)
            #expect(answer.json["openapi"] as? String == "3.1.0")
            let paths = try #require(answer.json["paths"] as? [String: [String: Any]])
            let expected: [String: Set<String>] = [
                "/v1/nonces": ["post"], "/v1/sign-in": ["post"], "/v1/changes": ["get"], "/v1/openapi.json": ["get"],
                "/v1/accounts/{client_id}/{sub}": ["get", "patch"], "/v1/accounts/{client_id}/{sub}/deletion": ["post"],
            ]
            #expect(paths.mapValues { Set($0.keys) } == expected)
            let signIn = try #require(paths["/v1/sign-in"]?["post"] as? [String: Any])
            let body = try #require(
                ((signIn["requestBody"] as? [String: Any])?["content"] as? [String: Any])?["application/json"] as? [String: Any])
            // Two forms: the native one, and a web sign-in's ticket.
            let forms = try #require((body["schema"] as? [String: Any])?["anyOf"] as? [[String: Any]])
            let fields = try #require(forms.first?["properties"] as? [String: Any])
            #expect(Set(fields.keys) == ["client_id", "identity_token", "nonce", "authorization_code", "redirect_uri", "full_name"])
            let ticketForm = try #require(forms.last)
            #expect(Set(((ticketForm["properties"] as? [String: Any]) ?? [:]).keys) == ["ticket"])
            #expect(ticketForm["required"] as? [String] == ["ticket"])
            let unauthorized = ((signIn["responses"] as? [String: Any])?["401"] as? [String: Any])?["description"] as? String
            #expect(unauthorized?.contains("ticket_invalid") == true, "\(unauthorized ?? "")")
            let responses = try #require(signIn["responses"] as? [String: Any])
            for status in ["200", "400", "401", "403", "413", "502", "503"] { #expect(responses[status] != nil, "\(status)") }
        }
    }
}

extension Int {
    var int64: Int64 { Int64(self) }
}
