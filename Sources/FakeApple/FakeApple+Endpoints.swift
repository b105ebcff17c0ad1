package import CryptoCore
import Foundation
import HTTPServer
import JOSE
import Locking

extension FakeApple {
    /// `POST /auth/token`. Returns the response and whether the client_secret was valid.
    func token(_ form: [String: String]) -> (HTTPResponse, Bool) {
        guard let clientID = form["client_id"], !clientID.isEmpty, let secret = form["client_secret"], !secret.isEmpty,
            let grantType = form["grant_type"], !grantType.isEmpty
        else { return (Self.oauthError("invalid_request"), false) }
        guard ["authorization_code", "refresh_token", "client_credentials"].contains(grantType) else {
            return (Self.oauthError("unsupported_grant_type"), false)
        }
        guard let team = clientSecretTeam(secret, clientID: clientID) else { return (Self.oauthError("invalid_client"), false) }
        if grantType == "client_credentials" { return (migrationToken(form, clientID: clientID, team: team), true) }
        let now = Date()
        if grantType == "authorization_code" {
            guard let code = form["code"], !code.isEmpty else { return (Self.oauthError("invalid_request"), true) }
            let lifetime = configuration.codeLifetime
            let issued: FakeAppleState.Code? = state.withLock { state in
                // A web authorization's code goes with its redirect URI (Apple: invalid_grant otherwise).
                guard var entry = state.codes[code], !entry.used, entry.clientID == clientID,
                    now.timeIntervalSince(entry.createdAt) <= lifetime,
                    entry.redirectURI == nil || entry.redirectURI == form["redirect_uri"]
                else {
                    state.codes[code]?.used = true
                    return nil
                }
                entry.used = true
                state.codes[code] = entry
                return entry
            }
            guard let issued else { return (Self.oauthError("invalid_grant"), true) }
            let refreshToken = "r" + Self.randomHex(24)
            state.withLock { $0.refreshTokens[refreshToken] = .init(clientID: clientID, sub: issued.sub, code: code) }
            let idToken = signIDToken(clientID: clientID, sub: issued.sub, email: issued.email, isPrivateEmail: issued.isPrivateEmail)
            return (
                Self.json([
                    "access_token": "a" + Self.randomHex(16), "token_type": "Bearer", "expires_in": 3600,
                    "refresh_token": refreshToken, "id_token": idToken,
                ]), true
            )
        }
        guard let refreshToken = form["refresh_token"], !refreshToken.isEmpty else {
            return (Self.oauthError("invalid_request"), true)
        }
        let entry = state.withLock { $0.refreshTokens[refreshToken] }
        guard let entry, !entry.revoked, entry.clientID == clientID else { return (Self.oauthError("invalid_grant"), true) }
        let idToken = signIDToken(clientID: clientID, sub: entry.sub, email: nil, isPrivateEmail: nil)
        return (
            Self.json(["access_token": "a" + Self.randomHex(16), "token_type": "Bearer", "expires_in": 3600, "id_token": idToken]),
            true
        )
    }

    /// `POST /auth/revoke`: 200 for any token once the client is authenticated.
    func revoke(_ form: [String: String]) -> (HTTPResponse, Bool) {
        guard let clientID = form["client_id"], !clientID.isEmpty, let secret = form["client_secret"], !secret.isEmpty,
            let token = form["token"], !token.isEmpty
        else { return (Self.oauthError("invalid_request"), false) }
        if let hint = form["token_type_hint"], hint != "refresh_token", hint != "access_token" {
            return (Self.oauthError("invalid_request"), false)
        }
        guard checkClientSecret(secret, clientID: clientID) else { return (Self.oauthError("invalid_client"), false) }
        state.withLock { state in
            if state.refreshTokens[token]?.clientID == clientID {
                state.refreshTokens[token]?.revoked = true
                state.refreshTokens[token]?.revokedByClient = true
                state.refreshTokens[token]?.revokeCalls += 1
            }
        }
        return (HTTPResponse(status: 200, headers: [("Content-Type", "application/json")], body: []), true)
    }

    /// What Apple checks on a client_secret: ES256 over the team key, `kid`, `iss`, `aud`, `sub`, `exp`, `iat`.
    func checkClientSecret(_ secret: String, clientID: String, now: Date = Date()) -> Bool {
        clientSecretTeam(secret, clientID: clientID, now: now) != nil
    }

    /// The team (`iss`) a valid client_secret speaks for; nil when any check fails. With teams
    /// configured, `iss` must be one of them and the signature verify with that team's key.
    func clientSecretTeam(_ secret: String, clientID: String, now: Date = Date()) -> String? {
        guard let jws = try? CompactJWS(secret), jws.algorithm == ES256.algorithm, let keyID = jws.keyID, !keyID.isEmpty,
            let claims = try? JSONSerialization.jsonObject(with: Data(jws.payloadBytes)) as? [String: Any],
            let iss = claims["iss"] as? String, !iss.isEmpty,
            let sub = claims["sub"] as? String, sub == clientID,
            let iat = (claims["iat"] as? NSNumber)?.doubleValue, let exp = (claims["exp"] as? NSNumber)?.doubleValue
        else { return nil }
        let teams = configuration.teams
        let verifyKey: P256.Signing.PublicKey?
        if teams.isEmpty {
            verifyKey = configuration.verifyKey
        } else {
            guard let team = teams.first(where: { $0.id == iss }) else { return nil }
            verifyKey = team.verifyKey
        }
        if let verifyKey {
            guard (try? ES256.verify(jws, publicKey: verifyKey)) != nil else { return nil }
        } else {
            guard jws.signatureBytes.count == 64 else { return nil }
        }
        let audiences: [String] = if let one = claims["aud"] as? String { [one] } else { (claims["aud"] as? [String]) ?? [] }
        guard audiences.contains(Self.issuer) else { return nil }
        guard exp > now.timeIntervalSince1970, exp - iat <= 15_777_000, iat <= now.timeIntervalSince1970 + 60 else { return nil }
        return iss
    }

    /// An identity token as Apple issues it; `transferSub` for a user migrated from another team
    /// (Apple adds the claim for 60 days after the transfer), `nonce` as the client passed it.
    package func signIDToken(
        clientID: String, sub: String, email: String?, isPrivateEmail: Bool?, transferSub: String? = nil,
        nonce: String? = nil, realUserStatus: Int? = nil, key: RSA.PrivateKey? = nil
    ) -> String {
        let now = Int(Date().timeIntervalSince1970)
        var claims: [String: Any] = [
            "iss": Self.issuer, "aud": clientID, "sub": sub, "iat": now, "exp": now + 600, "auth_time": now,
            "nonce_supported": true,
        ]
        if let transferSub { claims["transfer_sub"] = transferSub }
        if let nonce { claims["nonce"] = nonce }
        if let realUserStatus { claims["real_user_status"] = realUserStatus }
        if let email {
            claims["email"] = email
            claims["email_verified"] = "true"
        }
        if let isPrivateEmail { claims["is_private_email"] = isPrivateEmail ? "true" : "false" }
        let payload = (try? JSONSerialization.data(withJSONObject: claims, options: [.sortedKeys, .withoutEscapingSlashes])) ?? Data()
        return (try? JWTSigner.rs256(payload: Array(payload), keyID: configuration.keyID, privateKey: key ?? signingKey)) ?? ""
    }

    /// The same answer with its `id_token` re-signed by a key Apple never published (same `kid`).
    func resign(_ response: HTTPResponse) -> HTTPResponse {
        guard var object = try? JSONSerialization.jsonObject(with: Data(response.body)) as? [String: Any],
            let idToken = object["id_token"] as? String, let jws = try? CompactJWS(idToken)
        else { return response }
        object["id_token"] = try? JWTSigner.rs256(payload: jws.payloadBytes, keyID: configuration.keyID, privateKey: foreignKey)
        return Self.json(object)
    }

    // MARK: Admin endpoints (fake only)

    /// A JSON boolean, or the string "true" / anything else (as Apple writes `is_private_email`).
    static func flag(_ value: Any?) -> Bool? {
        switch value {
        case let flag as Bool: flag
        case let text as String: text == "true"
        default: nil
        }
    }

    func adminRegisterCode(_ request: HTTPRequest) -> HTTPResponse {
        guard let object = try? JSONSerialization.jsonObject(with: Data(request.body)) as? [String: Any],
            let clientID = object["client_id"] as? String, !clientID.isEmpty,
            let sub = object["sub"] as? String, !sub.isEmpty
        else { return Self.oauthError("invalid_request") }
        let isPrivate = Self.flag(object["is_private_email"])
        let code = registerCode(
            clientID: clientID, sub: sub, email: object["email"] as? String, isPrivateEmail: isPrivate,
            redirectURI: object["redirect_uri"] as? String)
        return Self.json(["code": code, "expires_in": Int(configuration.codeLifetime)])
    }

    /// `POST /fake/identity-tokens {client_id, sub, nonce, email?, is_private_email?, redirect_uri?,
    /// real_user_status?}`: what the device gets from Apple at sign-in, an identity token whose
    /// `nonce` claim is `nonce` as given (the app hands Apple the SHA-256 hex of the server's raw
    /// nonce) and a fresh authorization code (bound to `redirect_uri` for a web authorization).
    func adminIssueIdentityToken(_ request: HTTPRequest) -> HTTPResponse {
        guard let object = try? JSONSerialization.jsonObject(with: Data(request.body)) as? [String: Any],
            let clientID = object["client_id"] as? String, !clientID.isEmpty,
            let sub = object["sub"] as? String, !sub.isEmpty,
            let nonce = object["nonce"] as? String, !nonce.isEmpty
        else { return Self.oauthError("invalid_request") }
        let isPrivate = Self.flag(object["is_private_email"])
        let issued = issueIdentityToken(
            clientID: clientID, sub: sub, nonce: nonce, email: object["email"] as? String, isPrivateEmail: isPrivate,
            redirectURI: object["redirect_uri"] as? String, realUserStatus: (object["real_user_status"] as? NSNumber)?.intValue)
        return Self.json(["identity_token": issued.identityToken, "authorization_code": issued.authorizationCode])
    }

    func adminInjectFailures(_ request: HTTPRequest) -> HTTPResponse {
        guard let object = try? JSONSerialization.jsonObject(with: Data(request.body)) as? [String: Any],
            let endpoint = object["endpoint"] as? String, ["token", "revoke", "keys", "usermigrationinfo"].contains(endpoint),
            let responses = object["responses"] as? [Any]
        else { return Self.oauthError("invalid_request") }
        let failures = responses.compactMap(FakeAppleFailure.init(json:))
        guard failures.count == responses.count else { return Self.oauthError("invalid_request") }
        let retryAfter: String? =
            switch object["retry_after"] {
            case let number as NSNumber: number.stringValue
            case let text as String: text
            default: nil
            }
        injectFailures(endpoint: endpoint, responses: failures, retryAfter: retryAfter)
        return Self.json(["queued": failures.count])
    }

    func adminCalls() -> HTTPResponse {
        let encoder = JSONEncoder()
        // Milliseconds: tests compare call times (a Retry-After of 1 s is invisible at whole seconds).
        encoder.dateEncodingStrategy = .custom { date, encoder in
            let formatter = ISO8601DateFormatter()
            formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
            var container = encoder.singleValueContainer()
            try container.encode(formatter.string(from: date))
        }
        encoder.outputFormatting = [.sortedKeys]
        let data = (try? encoder.encode(calls)) ?? Data("[]".utf8)
        return .json(String(decoding: data, as: UTF8.self))
    }

    func adminSigningKey() -> HTTPResponse {
        Self.json(["kid": configuration.keyID, "pem": signingKey.pemRepresentation, "note": "test-only fake key"])
    }
}
