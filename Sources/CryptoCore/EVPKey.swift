internal import COpenSSL

/// Owns one `EVP_PKEY*`; the only place keys are freed.
///
/// @unchecked Sendable: the pointer is a `let` and the key is never modified after init;
/// OpenSSL allows concurrent signing/verifying with one unmodified EVP_PKEY (openssl-threads(7)).
final class EVPKey: @unchecked Sendable {
    let pointer: OpaquePointer

    /// Takes ownership of `pointer`: it is freed in deinit.
    init(taking pointer: OpaquePointer) {
        self.pointer = pointer
    }

    deinit {
        EVP_PKEY_free(pointer)
    }

    var baseID: Int32 { EVP_PKEY_get_base_id(pointer) }
    var bits: Int32 { EVP_PKEY_get_bits(pointer) }

    // MARK: Creating keys

    /// Generates a key with `EVP_PKEY_generate`; `configure` sets algorithm parameters on the
    /// keygen context (returns OpenSSL's result code, > 0 on success).
    static func generate(
        algorithm: String, configure: (OpaquePointer) -> Int32
    ) throws(CryptoError) -> EVPKey {
        guard let context = EVP_PKEY_CTX_new_from_name(nil, algorithm, nil) else {
            throw .openSSL("EVP_PKEY_CTX_new_from_name(\(algorithm))")
        }
        defer { EVP_PKEY_CTX_free(context) }
        guard EVP_PKEY_keygen_init(context) == 1 else { throw .openSSL("EVP_PKEY_keygen_init") }
        guard configure(context) > 0 else { throw .openSSL("EVP_PKEY_keygen parameters") }
        var key: OpaquePointer? = nil
        guard EVP_PKEY_generate(context, &key) == 1, let key else { throw .openSSL("EVP_PKEY_generate") }
        return EVPKey(taking: key)
    }

    /// Builds a key from an `OSSL_PARAM` array (`EVP_PKEY_fromdata`).
    static func fromData(
        algorithm: String, selection: Int32, parameters: UnsafeMutablePointer<OSSL_PARAM>
    ) throws(CryptoError) -> EVPKey {
        guard let context = EVP_PKEY_CTX_new_from_name(nil, algorithm, nil) else {
            throw .openSSL("EVP_PKEY_CTX_new_from_name(\(algorithm))")
        }
        defer { EVP_PKEY_CTX_free(context) }
        guard EVP_PKEY_fromdata_init(context) == 1 else { throw .openSSL("EVP_PKEY_fromdata_init") }
        var key: OpaquePointer? = nil
        guard EVP_PKEY_fromdata(context, &key, selection, parameters) == 1, let key else {
            throw .openSSL("EVP_PKEY_fromdata", code: .invalidKey)
        }
        return EVPKey(taking: key)
    }

    /// Parses a PEM private key: PKCS#8 (`PRIVATE KEY` block) or traditional
    /// (`RSA PRIVATE KEY` block, `EC PRIVATE KEY` block). Encrypted PEM is refused rather
    /// than prompting for a passphrase on the terminal.
    static func privateKey(pem: String) throws(CryptoError) -> EVPKey {
        let key = withMemoryBIO(reading: pem) { bio in
            PEM_read_bio_PrivateKey(bio, nil, { _, _, _, _ in 0 }, nil)
        }
        guard let key else { throw .openSSL("PEM_read_bio_PrivateKey", code: .invalidKey) }
        return EVPKey(taking: key)
    }

    /// Parses a PEM SubjectPublicKeyInfo (`BEGIN PUBLIC KEY`).
    static func publicKey(pem: String) throws(CryptoError) -> EVPKey {
        let key = withMemoryBIO(reading: pem) { bio in
            PEM_read_bio_PUBKEY(bio, nil, { _, _, _, _ in 0 }, nil)
        }
        guard let key else { throw .openSSL("PEM_read_bio_PUBKEY", code: .invalidKey) }
        return EVPKey(taking: key)
    }

    /// Parses a DER SubjectPublicKeyInfo.
    static func publicKey(der: [UInt8]) throws(CryptoError) -> EVPKey {
        let key: OpaquePointer? = der.withUnsafeBufferPointer { buffer in
            var cursor: UnsafePointer<UInt8>? = buffer.baseAddress
            return d2i_PUBKEY(nil, &cursor, buffer.count)
        }
        guard let key else { throw .openSSL("d2i_PUBKEY", code: .invalidKey) }
        return EVPKey(taking: key)
    }

    /// A new key holding only the public half (round trip through SPKI DER).
    func publicOnly() -> EVPKey {
        do {
            return try EVPKey.publicKey(der: publicKeyDER())
        } catch {
            fatalError("re-reading our own public key failed: \(error)")
        }
    }

    /// Runs `EVP_PKEY_public_check`: for EC keys this checks the point is on the curve.
    func checkPublicKey() throws(CryptoError) {
        guard let context = EVP_PKEY_CTX_new_from_pkey(nil, pointer, nil) else {
            throw .openSSL("EVP_PKEY_CTX_new_from_pkey")
        }
        defer { EVP_PKEY_CTX_free(context) }
        guard EVP_PKEY_public_check(context) == 1 else {
            throw .openSSL("EVP_PKEY_public_check", code: .invalidKey)
        }
    }

    // MARK: Serializing

    /// PKCS#8 PEM (`PRIVATE KEY` block), unencrypted.
    func privateKeyPEM() -> String {
        writeToMemoryBIO("PEM_write_bio_PrivateKey") { bio in
            PEM_write_bio_PrivateKey(bio, pointer, nil, nil, 0, nil, nil)
        }
    }

    /// SubjectPublicKeyInfo PEM (`BEGIN PUBLIC KEY`).
    func publicKeyPEM() -> String {
        writeToMemoryBIO("PEM_write_bio_PUBKEY") { bio in PEM_write_bio_PUBKEY(bio, pointer) }
    }

    /// SubjectPublicKeyInfo DER.
    func publicKeyDER() -> [UInt8] {
        let length = i2d_PUBKEY(pointer, nil)
        guard length > 0 else { fatalError("i2d_PUBKEY failed: \(drainOpenSSLErrors())") }
        var der = [UInt8](repeating: 0, count: Int(length))
        let written = der.withUnsafeMutableBufferPointer { buffer in
            var cursor: UnsafeMutablePointer<UInt8>? = buffer.baseAddress
            return i2d_PUBKEY(pointer, &cursor)
        }
        guard written == length else { fatalError("i2d_PUBKEY failed: \(drainOpenSSLErrors())") }
        return der
    }

    /// A big-number parameter (`n`, `e`, `qx`, ...) as unsigned big-endian bytes, left-padded
    /// to `paddedTo` when given.
    func bigNumberParameter(_ name: String, paddedTo width: Int? = nil) -> [UInt8]? {
        var number: OpaquePointer? = nil
        guard EVP_PKEY_get_bn_param(pointer, name, &number) == 1, let number else {
            _ = drainOpenSSLErrors()
            return nil
        }
        defer { BN_free(number) }
        return bigNumberBytes(number, paddedTo: width)
    }

    /// The curve name of an EC key (`prime256v1` for P-256), nil when it has none.
    var groupName: String? {
        var buffer = [CChar](repeating: 0, count: 80)
        var length = 0
        guard EVP_PKEY_get_group_name(pointer, &buffer, buffer.count, &length) == 1 else {
            _ = drainOpenSSLErrors()
            return nil
        }
        return String(decoding: buffer.prefix(length).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    // MARK: Signing

    /// `EVP_DigestSign` with SHA-256; `configure` may set padding on the key context.
    func digestSignSHA256(
        _ message: [UInt8], configure: ((OpaquePointer) -> Int32)? = nil
    ) throws(CryptoError) -> [UInt8] {
        guard let context = EVP_MD_CTX_new() else { throw .openSSL("EVP_MD_CTX_new") }
        defer { EVP_MD_CTX_free(context) }
        var keyContext: OpaquePointer? = nil  // owned by `context`
        guard EVP_DigestSignInit(context, &keyContext, EVP_sha256(), nil, pointer) == 1 else {
            throw .openSSL("EVP_DigestSignInit")
        }
        if let configure, let keyContext {
            guard configure(keyContext) > 0 else { throw .openSSL("EVP_PKEY_CTX signature parameters") }
        }
        var length = 0
        guard EVP_DigestSign(context, nil, &length, message, message.count) == 1 else {
            throw .openSSL("EVP_DigestSign(size)")
        }
        var signature = [UInt8](repeating: 0, count: length)
        guard EVP_DigestSign(context, &signature, &length, message, message.count) == 1 else {
            throw .openSSL("EVP_DigestSign")
        }
        signature.removeSubrange(length...)
        return signature
    }

    /// `EVP_DigestVerify` with SHA-256. Any failure (bad signature or error) is `false`.
    func digestVerifySHA256(
        _ signature: [UInt8], for message: [UInt8], configure: ((OpaquePointer) -> Int32)? = nil
    ) -> Bool {
        // Leave no failure reasons on this thread's queue: they would pollute later errors.
        defer { ERR_clear_error() }
        guard let context = EVP_MD_CTX_new() else { return false }
        defer { EVP_MD_CTX_free(context) }
        var keyContext: OpaquePointer? = nil  // owned by `context`
        guard EVP_DigestVerifyInit(context, &keyContext, EVP_sha256(), nil, pointer) == 1 else { return false }
        if let configure, let keyContext {
            guard configure(keyContext) > 0 else { return false }
        }
        return EVP_DigestVerify(context, signature, signature.count, message, message.count) == 1
    }
}

// MARK: - Helpers for call-local C objects

/// Unsigned big-endian bytes of a BIGNUM, optionally left-padded to `width`.
func bigNumberBytes(_ number: OpaquePointer, paddedTo width: Int? = nil) -> [UInt8]? {
    let byteCount = (Int(BN_num_bits(number)) + 7) / 8
    let size = width ?? byteCount
    guard byteCount <= size else { return nil }
    var bytes = [UInt8](repeating: 0, count: size)
    guard size == 0 || BN_bn2binpad(number, &bytes, Int32(size)) == Int32(size) else { return nil }
    return bytes
}

/// A read-only memory BIO over `text`, valid only inside `body`.
func withMemoryBIO<Result>(reading text: String, _ body: (OpaquePointer) -> Result?) -> Result? {
    let bytes = Array(text.utf8)
    return bytes.withUnsafeBytes { buffer -> Result? in
        guard let base = buffer.baseAddress, let bio = BIO_new_mem_buf(base, Int32(buffer.count)) else {
            return nil
        }
        defer { BIO_free(bio) }
        return body(bio)
    }
}

/// Runs a PEM writer against a memory BIO and returns what it wrote.
func writeToMemoryBIO(_ operation: String, _ write: (OpaquePointer) -> Int32) -> String {
    guard let bio = BIO_new(BIO_s_mem()) else { fatalError("BIO_new failed") }
    defer { BIO_free(bio) }
    guard write(bio) == 1 else { fatalError("\(operation) failed: \(drainOpenSSLErrors())") }
    var data: UnsafeMutablePointer<CChar>? = nil
    let length = COpenSSL_BIO_get_mem_data(bio, &data)
    guard length > 0, let data else { fatalError("\(operation) wrote nothing") }
    let buffer = UnsafeRawBufferPointer(start: data, count: length)
    return String(decoding: buffer, as: UTF8.self)
}
