internal import COpenSSL

/// RSA keys for RS256 (RSASSA-PKCS1-v1_5 with SHA-256, RFC 7518 §3.3).
package enum RSA {
    /// Smallest modulus accepted anywhere (RFC 7518 §3.3 requires 2048 bits).
    package static let minimumModulusBits = 2048
    /// Largest modulus accepted, bounding the cost of one verification.
    package static let maximumModulusBits = 8192

    package struct PublicKey: Sendable {
        let key: EVPKey
        /// Set up once: each verification copies it (see `SignatureTemplate`).
        let verifier: SignatureTemplate

        init(key: EVPKey) throws(CryptoError) {
            guard key.baseID == EVP_PKEY_RSA else {
                throw CryptoError(.unsupportedKey, operation: "RSA.PublicKey", message: "key is not an RSA key")
            }
            let bits = Int(key.bits)
            guard bits >= RSA.minimumModulusBits, bits <= RSA.maximumModulusBits else {
                throw CryptoError(
                    .unsupportedKey, operation: "RSA.PublicKey",
                    message: "modulus is \(bits) bits; \(RSA.minimumModulusBits)–\(RSA.maximumModulusBits) required")
            }
            self.key = key
            verifier = try SignatureTemplate(key: key, for: .verify, configure: RSA.pkcs1Padding)
        }

        /// Builds a key from the unsigned big-endian modulus and exponent (JWK `n`, `e`).
        package init(modulus: [UInt8], exponent: [UInt8]) throws(CryptoError) {
            let modulus = Array(modulus.drop { $0 == 0 })
            let exponent = Array(exponent.drop { $0 == 0 })
            guard modulus.count * 8 >= RSA.minimumModulusBits - 7, modulus.count * 8 <= RSA.maximumModulusBits else {
                throw CryptoError(
                    .unsupportedKey, operation: "RSA.PublicKey",
                    message: "modulus is about \(modulus.count * 8) bits; \(RSA.minimumModulusBits)–\(RSA.maximumModulusBits) required")
            }
            // An even or tiny exponent (e = 1 makes every "signature" valid) is never legitimate.
            guard let last = exponent.last, exponent.count <= 8, last & 1 == 1, exponent != [1] else {
                throw CryptoError(.invalidKey, operation: "RSA.PublicKey", message: "invalid public exponent")
            }
            guard modulus.last! & 1 == 1 else {
                throw CryptoError(.invalidKey, operation: "RSA.PublicKey", message: "modulus is even")
            }

            guard let builder = OSSL_PARAM_BLD_new() else { throw .openSSL("OSSL_PARAM_BLD_new") }
            defer { OSSL_PARAM_BLD_free(builder) }
            guard let n = BN_bin2bn(modulus, Int32(modulus.count), nil) else { throw .openSSL("BN_bin2bn") }
            defer { BN_free(n) }
            guard let e = BN_bin2bn(exponent, Int32(exponent.count), nil) else { throw .openSSL("BN_bin2bn") }
            defer { BN_free(e) }
            // The builder keeps references to the names, n and e until OSSL_PARAM_BLD_to_param
            // copies them: the names are C literals, n and e are freed after to_param.
            guard OSSL_PARAM_BLD_push_BN(builder, COpenSSL_PKEY_PARAM_RSA_N(), n) == 1,
                OSSL_PARAM_BLD_push_BN(builder, COpenSSL_PKEY_PARAM_RSA_E(), e) == 1
            else {
                throw .openSSL("OSSL_PARAM_BLD_push_BN")
            }
            guard let parameters = OSSL_PARAM_BLD_to_param(builder) else { throw .openSSL("OSSL_PARAM_BLD_to_param") }
            defer { OSSL_PARAM_free(parameters) }
            let key = try EVPKey.fromData(
                algorithm: "RSA", selection: COpenSSL_EVP_PKEY_PUBLIC_KEY, parameters: parameters)
            try self.init(key: key)
        }

        /// SubjectPublicKeyInfo PEM (`BEGIN PUBLIC KEY`).
        package init(pemRepresentation: String) throws(CryptoError) {
            try self.init(key: EVPKey.publicKey(pem: pemRepresentation))
        }

        /// SubjectPublicKeyInfo DER.
        package init(derRepresentation: [UInt8]) throws(CryptoError) {
            try self.init(key: EVPKey.publicKey(der: derRepresentation))
        }

        /// Unsigned big-endian modulus (JWK `n`).
        package var modulus: [UInt8] { key.bigNumberParameter("n") ?? [] }
        /// Unsigned big-endian public exponent (JWK `e`).
        package var exponent: [UInt8] { key.bigNumberParameter("e") ?? [] }
        package var modulusBits: Int { Int(key.bits) }

        package var pemRepresentation: String { key.publicKeyPEM() }
        package var derRepresentation: [UInt8] { key.publicKeyDER() }

        /// True only for a valid RSASSA-PKCS1-v1_5 SHA-256 signature of `message`.
        package func isValidRS256Signature(_ signature: [UInt8], for message: [UInt8]) -> Bool {
            verifier.verify(signature, for: message)
        }
    }

    package struct PrivateKey: Sendable {
        let key: EVPKey
        /// Derived once: signing 20,000 tokens must not re-parse anything.
        package let publicKey: PublicKey
        let signer: SignatureTemplate

        init(key: EVPKey) throws(CryptoError) {
            self.key = key
            self.publicKey = try PublicKey(key: key.publicOnly())
            signer = try SignatureTemplate(key: key, for: .sign, configure: RSA.pkcs1Padding)
        }

        package static func generate(bits: Int = 2048) throws(CryptoError) -> PrivateKey {
            guard bits >= RSA.minimumModulusBits, bits <= RSA.maximumModulusBits else {
                throw .invalidParameter("RSA.PrivateKey.generate", "bits must be \(RSA.minimumModulusBits)–\(RSA.maximumModulusBits)")
            }
            let key = try EVPKey.generate(algorithm: "RSA") { context in
                EVP_PKEY_CTX_set_rsa_keygen_bits(context, Int32(bits))
            }
            return try PrivateKey(key: key)
        }

        /// PKCS#8 (`PRIVATE KEY` block) or PKCS#1 (`RSA PRIVATE KEY` block) PEM, unencrypted.
        package init(pemRepresentation: String) throws(CryptoError) {
            try self.init(key: EVPKey.privateKey(pem: pemRepresentation))
        }

        /// PKCS#8 PEM (`PRIVATE KEY` block), unencrypted. Secret: never log it.
        package var pemRepresentation: String { key.privateKeyPEM() }

        /// RSASSA-PKCS1-v1_5 SHA-256 signature of `message` (JWS RS256).
        package func rs256Signature(for message: [UInt8]) throws(CryptoError) -> [UInt8] {
            try signer.sign(message)
        }
    }

    static func pkcs1Padding(_ context: OpaquePointer) -> Int32 {
        EVP_PKEY_CTX_set_rsa_padding(context, RSA_PKCS1_PADDING)
    }
}
