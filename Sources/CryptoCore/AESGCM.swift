internal import COpenSSL

/// AES-256-GCM with 12-byte nonces and 16-byte tags (NIST SP 800-38D).
package enum AESGCM {
    package static let keyByteCount = 32
    package static let nonceByteCount = 12
    package static let tagByteCount = 16

    package struct SealedBox: Sendable, Hashable {
        package let nonce: [UInt8]
        package let ciphertext: [UInt8]
        package let tag: [UInt8]

        package init(nonce: [UInt8], ciphertext: [UInt8], tag: [UInt8]) throws(CryptoError) {
            guard nonce.count == AESGCM.nonceByteCount else {
                throw .invalidParameter("AESGCM.SealedBox", "nonce must be 12 bytes")
            }
            guard tag.count == AESGCM.tagByteCount else {
                throw .invalidParameter("AESGCM.SealedBox", "tag must be 16 bytes")
            }
            self.nonce = nonce
            self.ciphertext = ciphertext
            self.tag = tag
        }

        /// nonce ‖ ciphertext ‖ tag.
        package init(combined: [UInt8]) throws(CryptoError) {
            guard combined.count >= AESGCM.nonceByteCount + AESGCM.tagByteCount else {
                throw .invalidParameter("AESGCM.SealedBox", "combined box shorter than nonce + tag")
            }
            try self.init(
                nonce: Array(combined.prefix(AESGCM.nonceByteCount)),
                ciphertext: Array(combined.dropFirst(AESGCM.nonceByteCount).dropLast(AESGCM.tagByteCount)),
                tag: Array(combined.suffix(AESGCM.tagByteCount)))
        }

        /// nonce ‖ ciphertext ‖ tag.
        package var combined: [UInt8] { nonce + ciphertext + tag }
    }

    /// Encrypts and authenticates. `nonce` defaults to 12 random bytes; never reuse one with a key.
    package static func seal(
        _ plaintext: [UInt8], key: [UInt8], nonce: [UInt8]? = nil, authenticating aad: [UInt8] = []
    ) throws(CryptoError) -> SealedBox {
        try checkKey(key)
        let nonce = nonce ?? SecureRandom.bytes(count: nonceByteCount)
        guard nonce.count == nonceByteCount else { throw .invalidParameter("AESGCM.seal", "nonce must be 12 bytes") }

        let context = try CipherContext(encrypting: true, key: key, nonce: nonce)
        defer { context.free() }
        try context.update(aad: aad)
        var ciphertext = try context.update(plaintext)
        var finalLength: Int32 = 0
        var scratch = [UInt8](repeating: 0, count: 16)
        guard EVP_EncryptFinal_ex(context.pointer, &scratch, &finalLength) == 1 else {
            throw .openSSL("EVP_EncryptFinal_ex")
        }
        ciphertext += scratch.prefix(Int(finalLength))  // always 0 bytes for GCM
        var tag = [UInt8](repeating: 0, count: tagByteCount)
        guard EVP_CIPHER_CTX_ctrl(context.pointer, EVP_CTRL_GCM_GET_TAG, Int32(tagByteCount), &tag) == 1 else {
            throw .openSSL("EVP_CIPHER_CTX_ctrl(GET_TAG)")
        }
        return try SealedBox(nonce: nonce, ciphertext: ciphertext, tag: tag)
    }

    /// Decrypts after checking the tag; any mismatch throws `.authenticationFailure`.
    package static func open(
        _ box: SealedBox, key: [UInt8], authenticating aad: [UInt8] = []
    ) throws(CryptoError) -> [UInt8] {
        try checkKey(key)
        let context = try CipherContext(encrypting: false, key: key, nonce: box.nonce)
        defer { context.free() }
        try context.update(aad: aad)
        var plaintext = try context.update(box.ciphertext)
        var tag = box.tag
        guard EVP_CIPHER_CTX_ctrl(context.pointer, EVP_CTRL_GCM_SET_TAG, Int32(tagByteCount), &tag) == 1 else {
            throw .openSSL("EVP_CIPHER_CTX_ctrl(SET_TAG)")
        }
        var finalLength: Int32 = 0
        var scratch = [UInt8](repeating: 0, count: 16)
        guard EVP_DecryptFinal_ex(context.pointer, &scratch, &finalLength) == 1 else {
            _ = drainOpenSSLErrors()
            // Do not hand back unauthenticated plaintext, not even in memory we keep.
            for index in plaintext.indices { plaintext[index] = 0 }
            throw CryptoError(.authenticationFailure, operation: "AESGCM.open", message: "authentication failed")
        }
        return plaintext + scratch.prefix(Int(finalLength))
    }

    private static func checkKey(_ key: [UInt8]) throws(CryptoError) {
        guard key.count == keyByteCount else {
            throw .invalidParameter("AESGCM", "key must be 32 bytes (AES-256)")
        }
    }

    /// One `EVP_CIPHER_CTX*`, used for a single seal or open call and freed by `free()`
    /// (a struct with an explicit free keeps it stack-scoped and never shared).
    private struct CipherContext {
        let pointer: OpaquePointer
        let encrypting: Bool

        init(encrypting: Bool, key: [UInt8], nonce: [UInt8]) throws(CryptoError) {
            guard let pointer = EVP_CIPHER_CTX_new() else { throw .openSSL("EVP_CIPHER_CTX_new") }
            self.pointer = pointer
            self.encrypting = encrypting
            let operation = encrypting ? "EVP_EncryptInit_ex" : "EVP_DecryptInit_ex"
            let initialize = encrypting ? EVP_EncryptInit_ex : EVP_DecryptInit_ex
            guard initialize(pointer, Fetched.aes256GCM.pointer, nil, nil, nil) == 1,
                EVP_CIPHER_CTX_ctrl(pointer, EVP_CTRL_GCM_SET_IVLEN, Int32(nonce.count), nil) == 1,
                initialize(pointer, nil, nil, key, nonce) == 1
            else {
                let error = CryptoError.openSSL(operation)
                EVP_CIPHER_CTX_free(pointer)
                throw error
            }
        }

        func free() { EVP_CIPHER_CTX_free(pointer) }

        func update(aad: [UInt8]) throws(CryptoError) {
            guard !aad.isEmpty else { return }
            var length: Int32 = 0
            let update = encrypting ? EVP_EncryptUpdate : EVP_DecryptUpdate
            guard update(pointer, nil, &length, aad, Int32(aad.count)) == 1 else {
                throw .openSSL(encrypting ? "EVP_EncryptUpdate(aad)" : "EVP_DecryptUpdate(aad)")
            }
        }

        func update(_ input: [UInt8]) throws(CryptoError) -> [UInt8] {
            guard !input.isEmpty else { return [] }
            guard input.count <= Int(Int32.max) - 16 else {
                throw .invalidParameter("AESGCM", "input too large")
            }
            var output = [UInt8](repeating: 0, count: input.count + 16)
            var length: Int32 = 0
            let update = encrypting ? EVP_EncryptUpdate : EVP_DecryptUpdate
            guard update(pointer, &output, &length, input, Int32(input.count)) == 1 else {
                throw .openSSL(encrypting ? "EVP_EncryptUpdate" : "EVP_DecryptUpdate")
            }
            return Array(output.prefix(Int(length)))
        }
    }
}

/// swift-crypto spelling: `AES.GCM.seal(...)`.
package enum AES {
    package typealias GCM = AESGCM
}
