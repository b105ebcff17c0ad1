internal import COpenSSL

/// NIST P-256 (secp256r1, prime256v1) keys for ES256 (ECDSA with SHA-256, RFC 7518 §3.4).
package enum P256 {
    package enum Signing {}

    /// Byte length of one coordinate and of each of R and S.
    static let coordinateByteCount = 32

    /// Accepts only keys on the P-256 curve.
    static func requireP256(_ key: EVPKey, operation: String) throws(CryptoError) {
        guard key.baseID == EVP_PKEY_EC else {
            throw CryptoError(.unsupportedKey, operation: operation, message: "key is not an EC key")
        }
        let group = key.groupName
        guard group == "prime256v1" || group == "P-256" || group == "secp256r1" else {
            throw CryptoError(
                .unsupportedKey, operation: operation,
                message: "EC key is on curve \(group ?? "explicit parameters"), P-256 required")
        }
    }
}

extension P256.Signing {
    package struct PublicKey: Sendable {
        let key: EVPKey
        /// Set up once: each verification copies it (see `SignatureTemplate`).
        let verifier: SignatureTemplate

        init(key: EVPKey) throws(CryptoError) {
            try P256.requireP256(key, operation: "P256.Signing.PublicKey")
            self.key = key
            verifier = try SignatureTemplate(key: key, for: .verify)
        }

        /// SubjectPublicKeyInfo PEM (`BEGIN PUBLIC KEY`).
        package init(pemRepresentation: String) throws(CryptoError) {
            let key = try EVPKey.publicKey(pem: pemRepresentation)
            try self.init(key: key)
            try key.checkPublicKey()
        }

        /// From JWK `x` and `y`: unsigned big-endian 32-byte coordinates. Off-curve points throw.
        package init(x: [UInt8], y: [UInt8]) throws(CryptoError) {
            guard x.count == P256.coordinateByteCount, y.count == P256.coordinateByteCount else {
                throw .invalidParameter("P256.Signing.PublicKey", "x and y must be 32 bytes each")
            }
            let point: [UInt8] = [0x04] + x + y  // SEC 1 uncompressed point
            guard let builder = OSSL_PARAM_BLD_new() else { throw .openSSL("OSSL_PARAM_BLD_new") }
            defer { OSSL_PARAM_BLD_free(builder) }
            // The builder keeps every pointer it is given until OSSL_PARAM_BLD_to_param copies
            // them: names and the group are C literals, and to_param runs inside withUnsafeBytes.
            guard
                OSSL_PARAM_BLD_push_utf8_string(
                    builder, COpenSSL_PKEY_PARAM_GROUP_NAME(), COpenSSL_GROUP_NAME_P256(), 0) == 1
            else {
                throw .openSSL("OSSL_PARAM_BLD_push_utf8_string")
            }
            let parameters = point.withUnsafeBytes { buffer -> UnsafeMutablePointer<OSSL_PARAM>? in
                guard
                    OSSL_PARAM_BLD_push_octet_string(
                        builder, COpenSSL_PKEY_PARAM_PUB_KEY(), buffer.baseAddress, buffer.count) == 1
                else { return nil }
                return OSSL_PARAM_BLD_to_param(builder)
            }
            guard let parameters else { throw .openSSL("OSSL_PARAM_BLD_to_param") }
            defer { OSSL_PARAM_free(parameters) }
            let key = try EVPKey.fromData(
                algorithm: "EC", selection: COpenSSL_EVP_PKEY_PUBLIC_KEY, parameters: parameters)
            try key.checkPublicKey()
            try self.init(key: key)
        }

        package var pemRepresentation: String { key.publicKeyPEM() }
        package var derRepresentation: [UInt8] { key.publicKeyDER() }

        /// JWK `x`: 32-byte big-endian affine x coordinate.
        package var x: [UInt8] { key.bigNumberParameter("qx", paddedTo: P256.coordinateByteCount) ?? [] }
        /// JWK `y`: 32-byte big-endian affine y coordinate.
        package var y: [UInt8] { key.bigNumberParameter("qy", paddedTo: P256.coordinateByteCount) ?? [] }

        /// Checks a JOSE ES256 signature: raw 64-byte R‖S over SHA-256 of `message`.
        package func isValidES256Signature(_ rawSignature: [UInt8], for message: [UInt8]) -> Bool {
            guard let der = ECDSASignature.derFromRaw(rawSignature) else { return false }
            return verifier.verify(der, for: message)
        }
    }

    package struct PrivateKey: Sendable {
        let key: EVPKey
        package let publicKey: PublicKey
        let signer: SignatureTemplate

        init(key: EVPKey) throws(CryptoError) {
            try P256.requireP256(key, operation: "P256.Signing.PrivateKey")
            self.key = key
            self.publicKey = try PublicKey(key: key.publicOnly())
            signer = try SignatureTemplate(key: key, for: .sign)
        }

        package static func generate() throws(CryptoError) -> PrivateKey {
            let key = try EVPKey.generate(algorithm: "EC") { context in
                EVP_PKEY_CTX_set_group_name(context, "P-256")
            }
            return try PrivateKey(key: key)
        }

        /// PKCS#8 PEM (`PRIVATE KEY` block, Apple's `.p8` files) or SEC 1 (`EC PRIVATE KEY` block).
        package init(pemRepresentation: String) throws(CryptoError) {
            try self.init(key: EVPKey.privateKey(pem: pemRepresentation))
        }

        /// PKCS#8 PEM, unencrypted. Secret: never log it.
        package var pemRepresentation: String { key.privateKeyPEM() }

        /// JOSE ES256 signature of `message`: raw R‖S, 64 bytes.
        package func es256Signature(for message: [UInt8]) throws(CryptoError) -> [UInt8] {
            let der = try signer.sign(message)
            guard let raw = ECDSASignature.rawFromDER(der) else {
                throw .openSSL("d2i_ECDSA_SIG")
            }
            return raw
        }
    }
}

/// Conversion between OpenSSL's DER `ECDSA-Sig-Value` and JOSE's raw R‖S.
enum ECDSASignature {
    static func rawFromDER(_ der: [UInt8]) -> [UInt8]? {
        let signature: OpaquePointer? = der.withUnsafeBufferPointer { buffer in
            var cursor: UnsafePointer<UInt8>? = buffer.baseAddress
            return d2i_ECDSA_SIG(nil, &cursor, buffer.count)
        }
        guard let signature else { return nil }
        defer { ECDSA_SIG_free(signature) }
        // r and s stay owned by `signature` (get0).
        var r: OpaquePointer? = nil
        var s: OpaquePointer? = nil
        ECDSA_SIG_get0(signature, &r, &s)
        guard let r, let s,
            let rBytes = bigNumberBytes(r, paddedTo: P256.coordinateByteCount),
            let sBytes = bigNumberBytes(s, paddedTo: P256.coordinateByteCount)
        else { return nil }
        return rBytes + sBytes
    }

    static func derFromRaw(_ raw: [UInt8]) -> [UInt8]? {
        let half = P256.coordinateByteCount
        guard raw.count == 2 * half else { return nil }
        guard let signature = ECDSA_SIG_new() else { return nil }
        defer { ECDSA_SIG_free(signature) }
        guard let r = BN_bin2bn(raw, Int32(half), nil) else { return nil }
        guard let s = raw.withUnsafeBufferPointer({ BN_bin2bn($0.baseAddress! + half, Int32(half), nil) }) else {
            BN_free(r)
            return nil
        }
        // On success ECDSA_SIG_set0 takes ownership of r and s (freed with `signature`).
        guard ECDSA_SIG_set0(signature, r, s) == 1 else {
            BN_free(r)
            BN_free(s)
            return nil
        }
        let length = i2d_ECDSA_SIG(signature, nil)
        guard length > 0 else { return nil }
        var der = [UInt8](repeating: 0, count: Int(length))
        let written = der.withUnsafeMutableBufferPointer { buffer in
            var cursor: UnsafeMutablePointer<UInt8>? = buffer.baseAddress
            return i2d_ECDSA_SIG(signature, &cursor)
        }
        return written == length ? der : nil
    }
}
