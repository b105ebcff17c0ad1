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

// MARK: - Signature contexts set up once per key

/// A SHA-256 signing or verification context for one key, set up once (`EVP_DigestSignInit` /
/// `EVP_DigestVerifyInit`, and the padding) and copied for each operation (`EVP_MD_CTX_copy_ex`).
/// In OpenSSL 3.0 every init fetches the signature, key management and digest implementations
/// from the provider and walks the whole name map (`OPENSSL_LH_doall_arg`, a sign-in's largest
/// OpenSSL cost after the RSA arithmetic); a copy duplicates the context without any of that.
///
/// @unchecked Sendable: `template` is written only in init; afterwards it is only read (copied),
/// which OpenSSL allows from any number of threads at once, and each operation works on its copy.
final class SignatureTemplate: @unchecked Sendable {
    private let template: OpaquePointer
    /// What `EVP_DigestSign`'s size query answers for this key: the buffer each signature gets.
    private let signatureCapacity: Int

    enum Purpose { case sign, verify }

    /// `configure` may set parameters on the key context (RSA's padding); > 0 is success.
    init(key: EVPKey, for purpose: Purpose, configure: ((OpaquePointer) -> Int32)? = nil) throws(CryptoError) {
        guard let context = EVP_MD_CTX_new() else { throw .openSSL("EVP_MD_CTX_new") }
        var keyContext: OpaquePointer? = nil  // owned by `context`
        let initialized =
            purpose == .sign
            ? EVP_DigestSignInit(context, &keyContext, Fetched.sha256.pointer, nil, key.pointer)
            : EVP_DigestVerifyInit(context, &keyContext, Fetched.sha256.pointer, nil, key.pointer)
        guard initialized == 1 else {
            EVP_MD_CTX_free(context)
            throw .openSSL(purpose == .sign ? "EVP_DigestSignInit" : "EVP_DigestVerifyInit")
        }
        if let configure, let keyContext, configure(keyContext) <= 0 {
            EVP_MD_CTX_free(context)
            throw .openSSL("EVP_PKEY_CTX signature parameters")
        }
        template = context
        signatureCapacity = purpose == .sign ? Int(EVP_PKEY_get_size(key.pointer)) : 0
    }

    deinit { EVP_MD_CTX_free(template) }

    /// A fresh copy of the template for one operation; the caller frees it.
    private func copy() -> OpaquePointer? {
        guard let context = EVP_MD_CTX_new() else { return nil }
        guard EVP_MD_CTX_copy_ex(context, template) == 1 else {
            EVP_MD_CTX_free(context)
            return nil
        }
        // The copy is used once: its final step need not keep it reusable (no second duplicate).
        EVP_MD_CTX_set_flags(context, EVP_MD_CTX_FLAG_FINALISE)
        return context
    }

    /// The signature of `message` (DER for ECDSA, the raw block for RSA).
    func sign(_ message: [UInt8]) throws(CryptoError) -> [UInt8] {
        guard let context = copy() else { throw .openSSL("EVP_MD_CTX_copy_ex") }
        defer { EVP_MD_CTX_free(context) }
        var signature = [UInt8](repeating: 0, count: max(signatureCapacity, 1))
        var length = signature.count
        guard EVP_DigestSign(context, &signature, &length, message, message.count) == 1 else {
            throw .openSSL("EVP_DigestSign")
        }
        signature.removeSubrange(length...)
        return signature
    }

    /// True only for a valid signature of `message`. Any failure (bad signature or error) is false.
    func verify(_ signature: [UInt8], for message: [UInt8]) -> Bool {
        // Leave no failure reasons on this thread's queue: they would pollute later errors.
        defer { ERR_clear_error() }
        guard let context = copy() else { return false }
        defer { EVP_MD_CTX_free(context) }
        return EVP_DigestVerify(context, signature, signature.count, message, message.count) == 1
    }
}
