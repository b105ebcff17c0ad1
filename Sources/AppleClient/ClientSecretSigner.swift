package import CryptoCore
package import Foundation
import JOSE

/// Mints the `client_secret` Apple wants on `/auth/token` and `/auth/revoke`: an ES256 JWT signed
/// with the team's `.p8` key. A fresh one is made for every call and never stored, so no secret
/// outlives its five minutes and no six-month expiry can break a deployment.
///
/// The secret is a credential: it is never logged, never put in an error, never cached.
package struct ClientSecretSigner: Sendable {
    package static let audience = "https://appleid.apple.com"
    /// Apple's limit on `exp - iat` (about six months); our own secrets stay far below it.
    package static let appleMaximumLifetime: Int64 = 15_777_000
    /// Longest lifetime this signer mints.
    package static let maximumLifetime: Int64 = 300

    package let teamID: String
    package let keyID: String
    private let privateKey: P256.Signing.PrivateKey
    package let lifetime: Int64

    package init(teamID: String, keyID: String, privateKey: P256.Signing.PrivateKey, lifetime: Int64 = 300) {
        self.teamID = teamID
        self.keyID = keyID
        self.privateKey = privateKey
        self.lifetime = max(1, min(lifetime, Self.maximumLifetime))
    }

    /// Loads the `.p8` (PEM PKCS#8, P-256) at `path`.
    package init(teamID: String, keyID: String, privateKeyFile path: String) throws {
        let pem: String
        do {
            pem = try String(contentsOfFile: path, encoding: .utf8)
        } catch {
            throw AppleClientError.configuration("SIWA_PRIVATE_KEY_FILE: cannot read \(path)")
        }
        let key: P256.Signing.PrivateKey
        do {
            key = try P256.Signing.PrivateKey(pemRepresentation: pem)
        } catch {
            throw AppleClientError.configuration("SIWA_PRIVATE_KEY_FILE: not a PEM P-256 private key (.p8)")
        }
        self.init(teamID: teamID, keyID: keyID, privateKey: key)
    }

    package var publicKey: P256.Signing.PublicKey { privateKey.publicKey }

    /// A new client_secret for `clientID`, valid from `now` for `lifetime` seconds.
    package func makeSecret(clientID: String, now: Date = Date()) throws -> String {
        let issuedAt = Int64(now.timeIntervalSince1970)
        // Claims iss, iat, exp, aud, sub, written directly with their keys sorted (as JSONEncoder's
        // .sortedKeys wrote them, at more than the signature's cost on Linux).
        var payload: [UInt8] = []
        payload.reserveCapacity(160)
        for (index, (name, value)) in [("aud", Self.audience), ("exp", nil), ("iat", nil), ("iss", teamID), ("sub", clientID)]
            .enumerated()
        {
            payload.append(UInt8(ascii: index == 0 ? "{" : ","))
            JSONText.appendString(name, to: &payload)
            payload.append(UInt8(ascii: ":"))
            if let value {
                JSONText.appendString(value, to: &payload)
            } else {
                payload += Array(String(name == "exp" ? issuedAt + lifetime : issuedAt).utf8)
            }
        }
        payload.append(UInt8(ascii: "}"))
        return try JWTSigner.es256(payload: payload, keyID: keyID, privateKey: privateKey)
    }
}

/// Problems building a call to Apple (configuration, not Apple's answer). Safe to print.
package struct AppleClientError: Error, Sendable, CustomStringConvertible {
    package var message: String
    package static func configuration(_ message: String) -> AppleClientError { .init(message: message) }
    package var description: String { message }
}
