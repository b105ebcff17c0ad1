package import CryptoCore
internal import Foundation

/// One JWK (RFC 7517) as Apple publishes them; key material stays base64url text.
package struct JSONWebKey: Sendable, Hashable, Codable {
    package var keyType: String
    package var keyID: String?
    package var use: String?
    package var algorithm: String?
    /// RSA modulus `n`, base64url.
    package var modulus: String?
    /// RSA exponent `e`, base64url.
    package var exponent: String?
    /// EC curve `crv`.
    package var curve: String?
    package var x: String?
    package var y: String?

    enum CodingKeys: String, CodingKey {
        case keyType = "kty", keyID = "kid", use, algorithm = "alg", modulus = "n", exponent = "e"
        case curve = "crv", x, y
    }

    package init(
        keyType: String, keyID: String? = nil, use: String? = nil, algorithm: String? = nil,
        modulus: String? = nil, exponent: String? = nil, curve: String? = nil, x: String? = nil, y: String? = nil
    ) {
        self.keyType = keyType
        self.keyID = keyID
        self.use = use
        self.algorithm = algorithm
        self.modulus = modulus
        self.exponent = exponent
        self.curve = curve
        self.x = x
        self.y = y
    }

    /// An RS256 signing key as Apple publishes it (`kty` RSA, `use` sig, `alg` RS256).
    package init(rs256 publicKey: RSA.PublicKey, keyID: String) {
        self.init(
            keyType: "RSA", keyID: keyID, use: "sig", algorithm: RS256.algorithm,
            modulus: Base64URL.encode(publicKey.modulus), exponent: Base64URL.encode(publicKey.exponent))
    }

    /// An ES256 key (`kty` EC, `crv` P-256).
    package init(es256 publicKey: P256.Signing.PublicKey, keyID: String) {
        self.init(
            keyType: "EC", keyID: keyID, use: "sig", algorithm: ES256.algorithm, curve: "P-256",
            x: Base64URL.encode(publicKey.x), y: Base64URL.encode(publicKey.y))
    }

    /// The RSA key, or nil when this is not a usable RSA key (wrong `kty`, bad `n`/`e`,
    /// modulus under 2048 bits).
    package func rsaPublicKey() -> RSA.PublicKey? {
        guard keyType == "RSA", let modulus, let exponent,
            let n = Base64URL.decode(modulus), let e = Base64URL.decode(exponent)
        else { return nil }
        return try? RSA.PublicKey(modulus: n, exponent: e)
    }

    /// The P-256 key, or nil when this is not a usable P-256 key.
    package func p256PublicKey() -> P256.Signing.PublicKey? {
        guard keyType == "EC", curve == "P-256", let x, let y,
            let xBytes = Base64URL.decode(x), let yBytes = Base64URL.decode(y)
        else { return nil }
        return try? P256.Signing.PublicKey(x: xBytes, y: yBytes)
    }
}

/// A JWK Set: `{"keys":[...]}` (Apple's `https://appleid.apple.com/auth/keys`).
package struct JSONWebKeySet: Sendable, Hashable {
    package var keys: [JSONWebKey]

    package init(keys: [JSONWebKey]) {
        self.keys = keys
    }

    /// Parses JWKS JSON. The document must be an object with a `keys` array (else `.malformed`);
    /// entries that are not objects or have no string `kty` are skipped, and fields of the wrong
    /// type read as absent, so one odd key never hides the others.
    package init(jsonBytes: some Collection<UInt8>) throws {
        guard let object = (try? JSONSerialization.jsonObject(with: Data(jsonBytes))) as? [String: Any],
            let entries = object["keys"] as? [Any]
        else { throw JOSEError.malformed("JWKS is not an object with a keys array") }
        self.keys = entries.compactMap { entry in
            guard let fields = entry as? [String: Any], let keyType = fields["kty"] as? String else { return nil }
            return JSONWebKey(
                keyType: keyType, keyID: fields["kid"] as? String, use: fields["use"] as? String,
                algorithm: fields["alg"] as? String, modulus: fields["n"] as? String,
                exponent: fields["e"] as? String, curve: fields["crv"] as? String,
                x: fields["x"] as? String, y: fields["y"] as? String)
        }
    }

    /// `{"keys":[...]}` with sorted keys; absent fields omitted.
    package func jsonBytes() -> [UInt8] {
        struct Document: Encodable { var keys: [JSONWebKey] }
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        do {
            return Array(try encoder.encode(Document(keys: keys)))
        } catch {
            fatalError("JWKS of strings always encodes: \(error)")
        }
    }

    /// RSA keys usable for RS256, by `kid`: `kty` RSA, `alg` RS256 or absent, `use` sig or
    /// absent, a `kid`, and a valid modulus of at least 2048 bits. Others are skipped; for a
    /// repeated `kid` the first usable key wins.
    package func rs256Keys() -> [String: RSA.PublicKey] {
        var result: [String: RSA.PublicKey] = [:]
        for key in keys {
            guard key.keyType == "RSA",
                key.algorithm == nil || key.algorithm == RS256.algorithm,
                key.use == nil || key.use == "sig",
                let keyID = key.keyID, result[keyID] == nil,
                let publicKey = key.rsaPublicKey()
            else { continue }
            result[keyID] = publicKey
        }
        return result
    }
}
