package import Foundation
import JOSE
import JSON
import SiwaCore

/// The claims of a verified `id_token` that we act on.
package struct AppleIdentity: Sendable, Equatable {
    package var sub: String
    package var email: String?
    package var isPrivateEmail: Bool?
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

    package var description: String { rawValue }
}

/// Verifies the `id_token` from a code exchange: RS256 with Apple's key set, `iss`, `aud`, `exp`, `sub`.
package struct IdentityTokenVerifier: Sendable {
    package let keys: AppleKeySet
    /// Clock skew tolerated on `exp`.
    package var leeway: TimeInterval = 60

    package init(keys: AppleKeySet) {
        self.keys = keys
    }

    /// `trustingTransportWhenKeysUnavailable`: for an `id_token` received directly from Apple's token
    /// endpoint (the exchange we made), whose signature cannot be checked only because Apple's keys
    /// could not be fetched: its claims are still checked, and the channel vouches for its origin
    /// (OpenID Connect Core 1.0, 3.1.3.7 step 6). The code is spent by then; refusing would lose the
    /// grant to a local, transient fault.
    package func verify(
        _ token: String, clientID: String, expectedSub: String, now: Date = Date(),
        trustingTransportWhenKeysUnavailable: Bool = false
    ) async throws(IdentityTokenError) -> AppleIdentity {
        guard let jws = try? CompactJWS(token) else { throw .malformed }
        guard jws.algorithm == RS256.algorithm, let keyID = jws.keyID else { throw .badSignature }
        switch await keys.key(keyID) {
        case .found(let key):
            do { try RS256.verify(jws, publicKey: key) } catch { throw .badSignature }
        case .unknownKey: throw .unknownKey
        case .unavailable:
            guard trustingTransportWhenKeysUnavailable else { throw .keysUnavailable }
        }
        return try checkClaims(of: jws, clientID: clientID, expectedSub: expectedSub, now: now)
    }

    private func checkClaims(of jws: CompactJWS, clientID: String, expectedSub: String, now: Date) throws(IdentityTokenError)
        -> AppleIdentity
    {
        guard let claims = JSONValue.object(jws.payloadBytes) else { throw .malformed }
        guard claims["iss"]?.stringValue == AppleNotification.appleIssuer else { throw .wrongIssuer }
        guard AppleNotification.audiences(claims["aud"])?.contains(clientID) == true else { throw .wrongAudience }
        guard let exp = claims["exp"]?.numberValue else { throw .malformed }
        guard exp + leeway > now.timeIntervalSince1970 else { throw .expired }
        guard let sub = claims["sub"]?.stringValue, sub == expectedSub else { throw .subMismatch }
        return AppleIdentity(
            sub: sub, email: claims["email"]?.stringValue, isPrivateEmail: AppleNotification.flag(claims["is_private_email"]))
    }
}
