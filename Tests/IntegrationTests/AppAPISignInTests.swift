import AppleClient
import CryptoCore
import FakeApple
import Foundation
import JOSE
import JobQueue
import Postgres
import TestTiming
import Testing
import AppAPI
import StoredTokens

/// `POST /v1/sign-in` against a real PostgreSQL and the fake Apple: every status of the contract,
/// in the order of its checks.
@Suite(.serialized) struct AppAPISignInTests {
    static let clientID = LifecycleHarness.clientID

    @Test func bearerIsCheckedBeforeAnyWork() async throws {
        try await withAppAPI { api in
            let nonce = try await api.nonce()
            let apple = api.appleSignIn(sub: "001.bearer", nonce: nonce)
            let body: [String: Any] = [
                "client_id": Self.clientID, "identity_token": apple.identityToken, "nonce": nonce,
                "authorization_code": apple.authorizationCode,
            ]
            for bearer in [nil, "wrong-token-0123456789abcdefghijklmnop", String(AppAPIHarness.token.dropLast()), ""] {
                let answer = try await api.request("POST", "/v1/sign-in", body: body, bearer: bearer)
                #expect(answer.status == 401 && answer.error == "unauthorized")
            }
            // Unauthorized requests to unknown paths, and with malformed bodies, are still 401 first.
            #expect(try await api.request("GET", "/nowhere", bearer: nil).status == 401)
            #expect(try await api.request("POST", "/v1/sign-in", rawBody: Data("{".utf8), bearer: "x").status == 401)
            #expect(try await api.request("POST", "/v1/nonces", bearer: nil).status == 401)
            // Nothing was done: the nonce is unspent, the code unexchanged, no account.
            #expect(!api.fake.calls.contains { $0.endpoint == "token" })
            #expect(try await api.lifecycle.status("001.bearer") == nil)
            let answer = try await api.request("POST", "/v1/sign-in", body: body, bearer: String(repeating: "b", count: 40))
            #expect(answer.status == 200, "the second configured token works too: \(answer.body)")
        }
    }

    @Test func nonceIsIssuedSingleUseAndExpires() async throws {
        try await withAppAPI { api in
            let issued = try await api.request("POST", "/v1/nonces")
            #expect(issued.status == 201)
            let nonce = try #require(issued.json["nonce"] as? String)
            #expect(Base64URL.decode(nonce)?.count ?? 0 >= 16, "≥ 128 random bits, base64url")
            let expires = try #require(issued.json["expires_at"] as? String)
            let expiry = try #require(try? Date(expires, strategy: Date.ISO8601FormatStyle(includingFractionalSeconds: true)))
            #expect(expiry.timeIntervalSinceNow > 240 && expiry.timeIntervalSinceNow <= 301)
            // Only the hash is stored; `expires_at` is the stored expiry in RFC 3339 UTC, to the millisecond.
            let stored = try await api.connection.query(
                #"SELECT nonce_hash, to_char(expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') FROM siwa.sign_in_nonces"#)
            #expect(stored.count == 1)
            #expect(try stored[0].decode(String.self, at: 1) == expires)
            #expect(try stored[0].decode([UInt8].self, at: 0) == SHA256.hash(Array(nonce.utf8)))

            // Unknown.
            let unknown = Base64URL.encode(SecureRandom.bytes(count: 32))
            let forUnknown = api.appleSignIn(sub: "001.n", nonce: unknown)
            let answer = try await api.signIn(identityToken: forUnknown.identityToken, nonce: unknown, code: nil)
            #expect(answer.status == 401 && answer.error == "nonce_invalid")

            // Used once, then reused.
            let apple = api.appleSignIn(sub: "001.n", nonce: nonce)
            #expect(try await api.signIn(identityToken: apple.identityToken, nonce: nonce, code: nil).status == 200)
            let reused = try await api.signIn(identityToken: apple.identityToken, nonce: nonce, code: nil)
            #expect(reused.status == 401 && reused.error == "nonce_invalid")

            // Expired (moved into the past), and then gone.
            let old = try await api.nonce()
            try await api.connection.execute("UPDATE siwa.sign_in_nonces SET expires_at = now() - interval '1 second'")
            let forOld = api.appleSignIn(sub: "001.n", nonce: old)
            let expired = try await api.signIn(identityToken: forOld.identityToken, nonce: old, code: nil)
            #expect(expired.status == 401 && expired.error == "nonce_invalid")
            #expect(try await api.connection.query("SELECT count(*) FROM siwa.sign_in_nonces")[0].decode(Int.self, at: 0) == 0)
        }
    }

    /// Nonces issued and never used are pruned once expired (the API prunes at start and every
    /// minute); a live one stays.
    @Test func expiredNoncesArePrunedAndLiveOnesKept() async throws {
        try await withAppAPI { api in
            _ = try await api.nonce()
            _ = try await api.nonce()
            try await api.connection.execute(
                "UPDATE siwa.sign_in_nonces SET expires_at = now() - interval '1 second' WHERE nonce_hash = (SELECT nonce_hash FROM siwa.sign_in_nonces ORDER BY nonce_hash LIMIT 1)")
            let store = AppAPIStore(pool: api.apiPool)
            #expect(try await store.pruneNonces() == 1)
            #expect(try await api.connection.query("SELECT count(*) FROM siwa.sign_in_nonces")[0].decode(Int.self, at: 0) == 1)
            #expect(!api.log.contains("could not prune expired nonces"), "\(api.log)")
        }
    }

    @Test func aNonceIsSpentEvenWhenALaterCheckFails() async throws {
        try await withAppAPI { api in
            let nonce = try await api.nonce()
            let apple = api.appleSignIn(sub: "001.spent", nonce: nonce)
            let wrongAudience = try await api.signIn(
                clientID: AppAPIHarness.otherClientID, identityToken: apple.identityToken, nonce: nonce, code: nil)
            #expect(wrongAudience.status == 401 && wrongAudience.error == "token_invalid")
            let retry = try await api.signIn(identityToken: apple.identityToken, nonce: nonce, code: nil)
            #expect(retry.status == 401 && retry.error == "nonce_invalid")
        }
    }

    @Test func twentyConcurrentSignInsWithOneNonceGiveExactlyOne200() async throws {
        try await withAppAPI { api in
            let nonce = try await api.nonce()
            let apple = api.appleSignIn(sub: "001.race", nonce: nonce)
            let statuses = try await withThrowingTaskGroup(of: (Int, String?).self) { group in
                for _ in 0..<20 {
                    group.addTask {
                        let answer = try await api.signIn(identityToken: apple.identityToken, nonce: nonce, code: apple.authorizationCode)
                        return (answer.status, answer.error)
                    }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(statuses.filter { $0.0 == 200 }.count == 1)
            #expect(statuses.filter { $0 == (401, "nonce_invalid") }.count == 19)
            #expect(api.fake.calls.filter { $0.endpoint == "token" }.count == 1, "one exchange")
        }
    }

    @Test func identityTokenChecks() async throws {
        try await withAppAPI { api in
            func refused(_ token: (String) throws -> String, clientID: String = Self.clientID) async throws -> Bool {
                let nonce = try await api.nonce()
                let answer = try await api.signIn(clientID: clientID, identityToken: try token(nonce), nonce: nonce, code: nil)
                return answer.status == 401 && answer.error == "token_invalid"
            }
            // The valid shape signs in: each case below changes one thing.
            let nonce = try await api.nonce()
            let valid = try await api.signIn(identityToken: try api.token(api.claims(sub: "001.t", nonce: nonce)), nonce: nonce, code: nil)
            #expect(valid.status == 200, "\(valid.body)")

            // A token for another aud (itself one of SIWA_CLIENT_IDS), and a client_id not configured.
            #expect(try await refused { try api.token(api.claims(sub: "001.t", nonce: $0, clientID: AppAPIHarness.otherClientID)) })
            #expect(try await refused({ try api.token(api.claims(sub: "001.t", nonce: $0, clientID: "com.evil.app")) }, clientID: "com.evil.app"))
            // The nonce claim is not the hash: the raw nonce itself, or the hash in upper case.
            #expect(try await refused { nonce in
                var claims = api.claims(sub: "001.t", nonce: nonce)
                claims["nonce"] = nonce
                return try api.token(claims)
            })
            #expect(try await refused { nonce in
                var claims = api.claims(sub: "001.t", nonce: nonce)
                claims["nonce"] = IdentityTokenVerifier.nonceClaim(rawNonce: nonce).uppercased()
                return try api.token(claims)
            })
            #expect(try await refused { nonce in
                var claims = api.claims(sub: "001.t", nonce: nonce)
                claims["nonce"] = nil
                return try api.token(claims)
            })
            // Expired (beyond the leeway), wrong issuer.
            #expect(try await refused { nonce in
                var claims = api.claims(sub: "001.t", nonce: nonce)
                claims["exp"] = Int(Date().timeIntervalSince1970) - 3600
                return try api.token(claims)
            })
            #expect(try await refused { nonce in
                var claims = api.claims(sub: "001.t", nonce: nonce)
                claims["iss"] = "https://evil.example"
                return try api.token(claims)
            })
            // alg none, and HS256 keyed with the public key's bytes.
            #expect(try await refused { nonce in
                let payload = try JSONSerialization.data(withJSONObject: api.claims(sub: "001.t", nonce: nonce))
                return JWTSigner.compact(
                    header: JWTSigner.header(algorithm: "none", keyID: api.fake.configuration.keyID), payload: Array(payload)
                ) { _ in [] }
            })
            #expect(try await refused { nonce in
                let payload = try JSONSerialization.data(withJSONObject: api.claims(sub: "001.t", nonce: nonce))
                let key = Array(api.fake.signingKey.publicKey.pemRepresentation.utf8)
                return JWTSigner.compact(
                    header: JWTSigner.header(algorithm: "HS256", keyID: api.fake.configuration.keyID), payload: Array(payload)
                ) { HMACSHA256.authenticationCode(for: $0, key: key) }
            })
            // Signed by a key Apple never published, under Apple's kid.
            #expect(try await refused { try api.token(api.claims(sub: "001.t", nonce: $0), key: try RSA.PrivateKey.generate()) })
            #expect(try await api.lifecycle.status("001.t") == "active", "only the valid sign-in wrote")
        }
    }

    @Test func unknownKidIsRefusedAfterOneRefetch() async throws {
        try await withAppAPI { api in
            // Wait until the key set has been loaded at start, then count the refetches a token causes.
            let nonce = try await api.nonce()
            #expect(try await api.signIn(identityToken: api.appleSignIn(sub: "001.k", nonce: nonce).identityToken, nonce: nonce, code: nil).status == 200)
            let before = api.keyFetches()
            let other = try await api.nonce()
            let answer = try await api.signIn(
                identityToken: try api.token(api.claims(sub: "001.k", nonce: other), keyID: "rotated-away"), nonce: other, code: nil)
            #expect(answer.status == 401 && answer.error == "token_invalid")
            #expect(api.keyFetches() == before + 1, "exactly one refetch for the unknown kid")
        }
    }

    @Test func pendingDeletionIsRefused() async throws {
        try await withAppAPI { api in
            try await api.signedIn(sub: "001.del")
            _ = try await api.lifecycle.requestDeletion(sub: "001.del")
            let answer = try await api.signIn(sub: "001.del")
            #expect(answer.status == 403 && answer.error == "account_deleting")
            #expect(try await api.lifecycle.status("001.del") == "pending_deletion")
        }
    }

    /// The statement that spends the nonce also reads the account the token names, before the
    /// token is verified: that read must decide nothing until the token proves its `sub`.
    @Test func aForgedTokenNamingADeletingAccountIsATokenError() async throws {
        try await withAppAPI { api in
            try await api.signedIn(sub: "001.forged")
            _ = try await api.lifecycle.requestDeletion(sub: "001.forged")
            let nonce = try await api.nonce()
            let forged = try api.token(api.claims(sub: "001.forged", nonce: nonce), key: try RSA.PrivateKey.generate())
            let answer = try await api.signIn(identityToken: forged, nonce: nonce, code: nil)
            #expect(answer.status == 401 && answer.error == "token_invalid", "not 403: the token proved nothing")
            let again = try await api.signIn(identityToken: api.appleSignIn(sub: "001.forged", nonce: nonce).identityToken, nonce: nonce, code: nil)
            #expect(again.status == 401 && again.error == "nonce_invalid", "the nonce was spent by the refused sign-in")
            // A token that does not even parse spends its nonce too (no account is read for it).
            let other = try await api.nonce()
            #expect(try await api.signIn(identityToken: "not.a-token", nonce: other, code: nil).error == "token_invalid")
            #expect(try await api.signIn(identityToken: api.appleSignIn(sub: "001.forged", nonce: other).identityToken, nonce: other, code: nil)
                .error == "nonce_invalid")
            #expect(try await api.lifecycle.status("001.forged") == "pending_deletion")
        }
    }

    @Test func exchangeOutcomes() async throws {
        try await withAppAPI { api in
            // invalid_grant: a code Apple never issued (or already used).
            let first = try await api.nonce()
            let apple = api.appleSignIn(sub: "001.ex", nonce: first)
            let invalid = try await api.signIn(identityToken: apple.identityToken, nonce: first, code: "c-never-issued")
            #expect(invalid.status == 400 && invalid.error == "code_invalid")
            #expect(try await api.lifecycle.status("001.ex") == nil, "no account without a token to revoke")

            // The exchange's id_token is about another sub: refused, and the token it obtained
            // handed to a revoke job before the answer (never dropped), which is retried through
            // Apple's 503s until it answers 200.
            let second = try await api.nonce()
            let mine = api.appleSignIn(sub: "001.ex", nonce: second)
            let theirs = api.fake.registerCode(clientID: Self.clientID, sub: "001.someone-else")
            let mismatch = try await api.signIn(identityToken: mine.identityToken, nonce: second, code: theirs)
            #expect(mismatch.status == 400 && mismatch.error == "code_invalid")
            #expect(try await api.lifecycle.status("001.ex") == nil, "no account for a refused sign-in")
            let obtained = api.fake.refreshTokens(clientID: Self.clientID, sub: "001.someone-else")
            #expect(obtained.count == 1, "one token issued for the code")
            let token = obtained.first ?? ""
            let queued = try await api.lifecycle.scalar(
                Int64.self, "SELECT id FROM siwa.jobs WHERE kind = 'revoke' AND sub = '001.ex' AND args ? 'token_enc'")
            #expect(queued != nil, "the sign-in queued the revoke of the token it did not keep")
            let revokeJob = queued ?? -1
            api.fake.injectFailures(endpoint: "revoke", responses: [.status(503), .status(503)])
            for _ in 0..<2 {
                let attempt = try await api.lifecycle.run(revokeJob)
                #expect(Self.isFailure(attempt), "a 503 fails the attempt, and the job retries")
                #expect(api.fake.isRevoked(refreshToken: token) == false)
            }
            _ = try await api.lifecycle.run(revokeJob)
            #expect(api.fake.isRevoked(refreshToken: token) == true, "revoked once Apple answered 200")
            #expect(try await api.lifecycle.jobRow(revokeJob).state == "completed")

            // A fresh code: 200, new, the token Apple issued stored encrypted for this row.
            let third = try await api.nonce()
            let good = api.appleSignIn(sub: "001.ex", nonce: third)
            let answer = try await api.signIn(identityToken: good.identityToken, nonce: third, code: good.authorizationCode)
            #expect(answer.status == 200)
            #expect(answer.json["new"] as? Bool == true && answer.json["has_refresh_token"] as? Bool == true)
            #expect(answer.json["status"] as? String == "active" && answer.json["sub"] as? String == "001.ex")
            #expect(answer.json["email"] as? String == "u@privaterelay.appleid.com")
            #expect(answer.json["is_private_email"] as? Bool == true && answer.json["email_verified"] as? Bool == true)
            let stored = try #require(try await api.lifecycle.storedToken("001.ex"))
            #expect(api.fake.refreshTokens(clientID: Self.clientID, sub: "001.ex") == [
                try api.lifecycle.tokenBox.open(stored, clientID: Self.clientID, sub: "001.ex")
            ])
            #expect(try await api.lifecycle.changes("001.ex").map(\.change) == ["linked"])

            // Signed in again: not new, and the code is exchanged though a token is stored.
            let calls = api.fake.calls.filter { $0.endpoint == "token" }.count
            let again = try await api.signIn(sub: "001.ex")
            #expect(again.status == 200 && again.json["new"] as? Bool == false)
            #expect(api.fake.calls.filter { $0.endpoint == "token" }.count == calls + 1)
        }
    }

    @Test func appleDownIs502AndCreatesNothingWhileAnExistingAccountStillSignsIn() async throws {
        try await withAppAPI { api in
            try await api.signedIn(sub: "001.existing")
            api.fake.injectFailures(endpoint: "token", responses: [.status(503), .status(503)])
            let answer = try await api.signIn(sub: "001.newcomer")
            #expect(answer.status == 502 && answer.error == "token_exchange_failed")
            #expect(try await api.lifecycle.status("001.newcomer") == nil)
            #expect(try await api.lifecycle.changes("001.newcomer").isEmpty)
            // Apple's token endpoint is still failing: a sign-in without a code needs no exchange.
            let existing = try await api.signIn(sub: "001.existing", withCode: false)
            #expect(existing.status == 200 && existing.json["new"] as? Bool == false)
            #expect(api.fake.calls.filter { $0.endpoint == "token" && $0.status == 503 }.count == 1)
        }
    }

    @Test func appleTimeoutAnswersWithin5s() async throws {
        try await withAppAPI(appleTimeout: AppAPIServer.appleTimeout) { api in
            api.fake.injectFailures(endpoint: "token", responses: [.timeout])
            let started = ContinuousClock.now
            let answer = try await api.signIn(sub: "001.slow")
            #expect(answer.status == 502 && answer.error == "token_exchange_failed")
            // The fake holds the call for 30 s: only the client's 5 s bound ends it sooner (the hold
            // and this bound times `TestTimeScale`, the product's 5 s not).
            #expect(ContinuousClock.now - started < TestTimeScale.scaled(.seconds(25)))
            #expect(try await api.lifecycle.status("001.slow") == nil)
        }
    }

    static func isFailure(_ result: JobResult) -> Bool {
        if case .failed = result { true } else { false }
    }

    @Test func aSignInAfterDeletionStartsANewLife() async throws {
        try await withAppAPI { api in
            try await api.signedIn(sub: "001.life")
            _ = try await api.request("PATCH", "/v1/accounts/\(Self.clientID)/001.life", body: ["app_user_id": "u-1"])
            let job = try await api.lifecycle.requestDeletion(sub: "001.life")
            try await api.lifecycle.run(job)
            #expect(try await api.lifecycle.status("001.life") == "deleted")
            let answer = try await api.signIn(sub: "001.life")
            #expect(answer.status == 200 && answer.json["status"] as? String == "active")
            // Deletion means gone: the same Apple user is somebody new to the app, never handed the
            // deleted person's identity; the `deleted` change still said whom to delete.
            #expect(answer.json["new"] as? Bool == true, "a returning user after a deletion is new")
            #expect(answer.json["app_user_id"] is NSNull, "the deleted life's app_user_id is forgotten")
            #expect(answer.json["has_refresh_token"] as? Bool == true)
            let deleted = try await api.connection.query(
                "SELECT app_user_id FROM siwa.account_changes WHERE sub = '001.life' AND change = 'deleted'")
            #expect(try deleted.first?.decode(String?.self, at: 0) == "u-1", "the deleted change names whom to delete")
        }
    }

    @Test func aTransferSubLandsOnTheImportedLine() async throws {
        try await withAppAPI { api in
            try await api.connection.execute(
                "INSERT INTO siwa.transfer_imports (client_id, transfer_sub, app_user_id) VALUES (\(Self.clientID), 'tsub.1', 'user-from-old-team')")
            let nonce = try await api.nonce()
            let token = api.fake.signIDToken(
                clientID: Self.clientID, sub: "001.moved", email: nil, isPrivateEmail: nil, transferSub: "tsub.1",
                nonce: IdentityTokenVerifier.nonceClaim(rawNonce: nonce))
            let code = api.fake.registerCode(clientID: Self.clientID, sub: "001.moved")
            let answer = try await api.signIn(identityToken: token, nonce: nonce, code: code)
            #expect(answer.status == 200, "\(answer.body)")
            #expect(answer.json["app_user_id"] as? String == "user-from-old-team" && answer.json["new"] as? Bool == false)
            #expect(answer.json["has_refresh_token"] as? Bool == true, "the code is exchanged as for any sign-in")
            #expect(try await api.lifecycle.changes("001.moved").map(\.change).first == "transferred")
        }
    }

    @Test func malformedAndOversizedRequests() async throws {
        try await withAppAPI { api in
            for raw in ["", "{", "[]", #"{"client_id":1,"identity_token":"x","nonce":"y"}"#, #"{"client_id":"a","nonce":"y"}"#,
                #"{"client_id":"a","identity_token":"x","nonce":"y","authorization_code":5}"#]
            {
                let answer = try await api.request("POST", "/v1/sign-in", rawBody: Data(raw.utf8))
                #expect(answer.status == 400 && answer.error == "bad_request", "\(raw)")
            }
            let nonce = try await api.nonce()
            let hugeToken = String(repeating: "a", count: 8 * 1024 + 1)
            let tooLong = try await api.signIn(identityToken: hugeToken, nonce: nonce, code: nil)
            #expect(tooLong.status == 400 && tooLong.error == "bad_request")
            let body = Data(("{\"pad\":\"" + String(repeating: "x", count: 17 * 1024) + "\"}").utf8)
            #expect(try await api.request("POST", "/v1/sign-in", rawBody: body).status == 413)
            #expect(try await api.request("GET", "/v1/sign-in").status == 405)
            #expect(try await api.request("GET", "/v2/nothing").status == 404)
        }
    }

    @Test func noSecretReachesTheLog() async throws {
        try await withAppAPI { api in
            var secrets: [String] = [AppAPIHarness.token]
            for sub in ["001.log1", "001.log2"] {
                let nonce = try await api.nonce()
                let apple = api.appleSignIn(sub: sub, nonce: nonce)
                secrets += [nonce, apple.identityToken, apple.authorizationCode]
                #expect(try await api.signIn(identityToken: apple.identityToken, nonce: nonce, code: apple.authorizationCode).status == 200)
                secrets += api.fake.refreshTokens(clientID: Self.clientID, sub: sub)
            }
            // Failures log too: a refused token, a failed exchange, a wrong bearer.
            let nonce = try await api.nonce()
            let apple = api.appleSignIn(sub: "001.log3", nonce: nonce)
            secrets += [nonce, apple.identityToken, apple.authorizationCode]
            api.fake.injectFailures(endpoint: "token", responses: [.status(503)])
            #expect(try await api.signIn(identityToken: apple.identityToken, nonce: nonce, code: apple.authorizationCode).status == 502)
            _ = try await api.request("POST", "/v1/nonces", bearer: "not-the-token-but-long-enough-0123456789")
            let log = api.log
            #expect(log.contains("sign-in"), "the log was written")
            for secret in secrets { #expect(!log.contains(secret), "a secret reached the log") }
            #expect(!log.contains("not-the-token-but-long-enough"))
            #expect(!log.split(separator: "\n").contains { $0.contains("eyJ") }, "no JWT-looking string")
        }
    }
}
