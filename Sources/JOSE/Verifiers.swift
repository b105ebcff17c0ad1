package import CryptoCore

/// RS256 verification with the algorithm pinned: only `alg` "RS256" is ever accepted, whatever
/// the token claims (no `none`, no HS256-with-the-public-key confusion, no RS512).
package enum RS256 {
    package static let algorithm = "RS256"

    /// Lets modules that depend on JOSE but not CryptoCore (ReceiverCore) name and store keys.
    package typealias PublicKey = RSA.PublicKey

    /// Verifies with the key named by the header's `kid`.
    ///
    /// Checks, in order: `alg` is exactly "RS256" (`.unsupportedAlgorithm`, before any key lookup),
    /// no `crit` (`.malformed`), `kid` present and known (`.unknownKey`), signature (`.badSignature`).
    package static func verify(_ jws: CompactJWS, keys: (String) -> RSA.PublicKey?) throws {
        try checkHeader(jws, algorithm: algorithm)
        guard let keyID = jws.keyID else { throw JOSEError(.unknownKey(nil), reason: "no kid in header") }
        guard let key = keys(keyID) else { throw JOSEError(.unknownKey(keyID), reason: "no key with this kid") }
        try verifySignature(jws, with: key)
    }

    package static func verify(_ jws: CompactJWS, keys: [String: RSA.PublicKey]) throws {
        try verify(jws, keys: { keys[$0] })
    }

    /// Verifies with one known key, ignoring `kid` (RFC examples carry none).
    package static func verify(_ jws: CompactJWS, publicKey: RSA.PublicKey) throws {
        try checkHeader(jws, algorithm: algorithm)
        try verifySignature(jws, with: publicKey)
    }

    private static func verifySignature(_ jws: CompactJWS, with key: RSA.PublicKey) throws {
        guard key.isValidRS256Signature(jws.signatureBytes, for: jws.signingInput) else {
            throw JOSEError(.badSignature, reason: "RS256 signature does not verify")
        }
    }
}

/// ES256 verification with the algorithm pinned (for checking our own client_secret JWTs).
package enum ES256 {
    package static let algorithm = "ES256"

    /// `alg` must be exactly "ES256" and the signature a valid raw R‖S; `kid` is not checked.
    package static func verify(_ jws: CompactJWS, publicKey: P256.Signing.PublicKey) throws {
        try checkHeader(jws, algorithm: algorithm)
        guard publicKey.isValidES256Signature(jws.signatureBytes, for: jws.signingInput) else {
            throw JOSEError(.badSignature, reason: "ES256 signature does not verify")
        }
    }
}

private func checkHeader(_ jws: CompactJWS, algorithm: String) throws {
    guard jws.algorithm == algorithm else {
        throw JOSEError(.unsupportedAlgorithm(jws.algorithm), reason: "only \(algorithm) is accepted")
    }
    guard !jws.hasCriticalHeader else {
        throw JOSEError.malformed("critical header parameters are not supported")
    }
}
