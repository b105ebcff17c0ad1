package import Foundation
import CryptoCore
import JOSE
import JSON
import SiwaModel

/// The claims of a verified `id_token` that we act on.
package struct AppleIdentity: Sendable, Equatable {
    package var sub: String
    package var email: String?
    package var isPrivateEmail: Bool?
    package var emailVerified: Bool?
    /// `transfer_sub`: present for 60 days on tokens of users moved from another team (TN3159).
    package var transferSub: String?
    /// `real_user_status` (0, 1, 2: Apple's anti-fraud signal), as shown: `unsupported`, `unknown`,
    /// `likely_real`; nil when absent or another value.
    package var realUserStatus: String?

    /// The names of `real_user_status`'s values, by value.
    package static let realUserStatusNames = ["unsupported", "unknown", "likely_real"]
}

/// Why an `id_token` was refused. `rawValue` is stored as a failure reason: it holds no token content.
package enum IdentityTokenError: String, Error, Sendable, CustomStringConvertible {
    case malformed = "id_token_malformed"
    case unknownKey = "id_token_unknown_key"
    case keysUnavailable = "id_token_keys_unavailable"
    case badSignature = "id_token_bad_signature"
    case wrongIssuer = "id_token_wrong_issuer"
    case wrongAudience = "id_token_wrong_audience"
    case expired = "id_token_expired"
    case subMismatch = "id_token_sub_mismatch"
    case nonceMismatch = "id_token_nonce_mismatch"

    package var description: String { rawValue }
}

/// An identity token parsed once, structure and claims, and not yet verified: a sign-in reads the
/// `sub` it claims (to read that account ahead) and verifies the same parse, so the token is
/// decoded and its payload read once, not three times.
package struct ParsedIdentityToken: Sendable {
    let jws: CompactJWS
    let claims: [String: JSONValue]

    /// Nil when the token is not a compact JWS whose payload is a JSON object.
    package init?(_ token: String) {
        guard let jws = try? CompactJWS(token, checkPayloadIsJSONObject: false),
            let claims = JSONValue.object(jws.payloadBytes)
        else { return nil }
        (self.jws, self.claims) = (jws, claims)
    }

    /// The `sub` the token claims, unverified: to be trusted only after `verify` accepts it.
    package var claimedSub: String? { claims["sub"]?.stringValue }
}

/// Verifies Apple identity tokens: RS256 with Apple's key set (the receiver's `AppleKeySet`, so one
/// cache, one rate-limited refetch and the same stale-keys rule), `iss`, `aud`, `exp`, and then
/// either the `sub` a code exchange was for or the `nonce` a sign-in was issued.
package struct IdentityTokenVerifier: Sendable {
    package let keys: AppleKeySet
    /// Clock skew tolerated on `exp`.
    package var leeway: TimeInterval = 60

    package init(keys: AppleKeySet) {
        self.keys = keys
    }

    /// The `id_token` of a code exchange: it must be about `expectedSub`.
    ///
    /// `trustingTransportWhenKeysUnavailable`: for an `id_token` received directly from Apple's token
    /// endpoint (the exchange we made), whose signature cannot be checked only because Apple's keys
    /// could not be fetched: its claims are still checked, and the channel vouches for its origin
    /// (OpenID Connect Core 1.0, 3.1.3.7 step 6). The code is spent by then; refusing would lose the
    /// grant to a local, transient fault.
    package func verify(
        _ token: String, clientID: String, expectedSub: String, now: Date = Date(),
        trustingTransportWhenKeysUnavailable: Bool = false
    ) async throws(IdentityTokenError) -> AppleIdentity {
        let (identity, _) = try await verifiedClaims(
            ParsedIdentityToken(token), clientID: clientID, now: now,
            trustingTransportWhenKeysUnavailable: trustingTransportWhenKeysUnavailable)
        guard identity.sub == expectedSub else { throw .subMismatch }
        return identity
    }

    /// The identity token of a sign-in, which the client hands us (so its signature is always
    /// checked): its `nonce` claim must be the lowercase hex SHA-256 of the raw nonce the server
    /// issued, compared in constant time.
    package func verify(_ token: String, clientID: String, rawNonce: String, now: Date = Date()) async throws(
        IdentityTokenError
    ) -> AppleIdentity {
        try await verify(ParsedIdentityToken(token), clientID: clientID, rawNonce: rawNonce, now: now)
    }

    /// As `verify(_:clientID:rawNonce:now:)`, on a token already parsed (nil: it did not parse).
    package func verify(_ token: ParsedIdentityToken?, clientID: String, rawNonce: String, now: Date = Date()) async throws(
        IdentityTokenError
    ) -> AppleIdentity {
        let (identity, claims) = try await verifiedClaims(
            token, clientID: clientID, now: now, trustingTransportWhenKeysUnavailable: false)
        guard let claimed = claims["nonce"]?.stringValue,
            ConstantTime.equals(Array(claimed.utf8), Array(Self.nonceClaim(rawNonce: rawNonce).utf8))
        else { throw .nonceMismatch }
        return identity
    }

    /// What the client hands Apple for a raw nonce: lowercase hex SHA-256 of its UTF-8 bytes.
    package static func nonceClaim(rawNonce: String) -> String {
        let digits = Array("0123456789abcdef".utf8)
        return String(decoding: SHA256.hash(Array(rawNonce.utf8)).flatMap { [digits[Int($0 >> 4)], digits[Int($0 & 0x0F)]] }, as: UTF8.self)
    }

    /// A number (what Apple sends) or a numeric string, 0 to 2.
    static func realUserStatus(_ value: JSONValue?) -> String? {
        let number: Double? =
            switch value {
            case .number(let number)?: number
            case .string(let text)?: Double(text)
            default: nil
            }
        guard let number, let index = Int(exactly: number), AppleIdentity.realUserStatusNames.indices.contains(index) else {
            return nil
        }
        return AppleIdentity.realUserStatusNames[index]
    }

    /// Signature (alg pinned to RS256, key by `kid`), `iss`, `aud` ∋ `clientID`, `exp`, a `sub`.
    private func verifiedClaims(
        _ token: ParsedIdentityToken?, clientID: String, now: Date, trustingTransportWhenKeysUnavailable: Bool
    ) async throws(IdentityTokenError) -> (AppleIdentity, [String: JSONValue]) {
        guard let jws = token?.jws, let claims = token?.claims else { throw .malformed }
        guard jws.algorithm == RS256.algorithm, let keyID = jws.keyID else { throw .badSignature }
        switch await keys.key(keyID) {
        case .found(let key):
            do { try RS256.verify(jws, publicKey: key) } catch { throw .badSignature }
        case .unknownKey: throw .unknownKey
        case .unavailable:
            guard trustingTransportWhenKeysUnavailable else { throw .keysUnavailable }
        }
        guard claims["iss"]?.stringValue == AppleNotification.appleIssuer else { throw .wrongIssuer }
        guard AppleNotification.audiences(claims["aud"])?.contains(clientID) == true else { throw .wrongAudience }
        guard let exp = claims["exp"]?.numberValue else { throw .malformed }
        guard exp + leeway > now.timeIntervalSince1970 else { throw .expired }
        guard let sub = claims["sub"]?.stringValue, !sub.isEmpty else { throw .malformed }
        let identity = AppleIdentity(
            sub: sub, email: claims["email"]?.stringValue, isPrivateEmail: AppleNotification.flag(claims["is_private_email"]),
            emailVerified: AppleNotification.flag(claims["email_verified"]),
            transferSub: claims["transfer_sub"]?.stringValue.flatMap { $0.isEmpty ? nil : $0 },
            realUserStatus: Self.realUserStatus(claims["real_user_status"]))
        return (identity, claims)
    }
}
