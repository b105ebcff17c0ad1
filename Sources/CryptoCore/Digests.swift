internal import COpenSSL

/// SHA-256 (FIPS 180-4).
package enum SHA256 {
    package static let byteCount = 32

    package static func hash(_ bytes: [UInt8]) -> [UInt8] {
        var digest = [UInt8](repeating: 0, count: Int(EVP_MAX_MD_SIZE))
        var length: UInt32 = 0
        guard EVP_Digest(bytes, bytes.count, &digest, &length, Fetched.sha256.pointer, nil) == 1 else {
            // Only fails on allocation failure or a broken provider; neither is recoverable.
            fatalError("EVP_Digest(SHA-256) failed: \(drainOpenSSLErrors().joined(separator: "; "))")
        }
        return Array(digest.prefix(Int(length)))
    }
}

/// HMAC-SHA-256 (RFC 2104, RFC 4231).
package enum HMACSHA256 {
    package static func authenticationCode(for message: [UInt8], key: [UInt8]) -> [UInt8] {
        var code = [UInt8](repeating: 0, count: Int(EVP_MAX_MD_SIZE))
        var length: UInt32 = 0
        // HMAC() treats a NULL key specially; an empty array still passes a valid pointer here.
        let result = HMAC(EVP_sha256(), key, Int32(key.count), message, message.count, &code, &length)
        guard result != nil else {
            fatalError("HMAC(SHA-256) failed: \(drainOpenSSLErrors().joined(separator: "; "))")
        }
        return Array(code.prefix(Int(length)))
    }

    /// Constant-time comparison of two MACs.
    package static func isValidAuthenticationCode(_ code: [UInt8], for message: [UInt8], key: [UInt8]) -> Bool {
        ConstantTime.equals(code, authenticationCode(for: message, key: key))
    }
}

/// Algorithms fetched from OpenSSL's default provider once per process. `EVP_sha256()` and
/// `EVP_aes_256_gcm()` name legacy tables: OpenSSL 3 fetches the provider's implementation for
/// each operation started with one (a locked cache lookup); a fetched one is used as it is.
///
/// @unchecked Sendable: a fetched algorithm is immutable and OpenSSL shares it between threads.
struct Fetched: @unchecked Sendable {
    let pointer: OpaquePointer

    static let sha256 = Fetched(EVP_MD_fetch(nil, "SHA256", nil), "EVP_MD_fetch(SHA256)")
    static let aes256GCM = Fetched(EVP_CIPHER_fetch(nil, "AES-256-GCM", nil), "EVP_CIPHER_fetch(AES-256-GCM)")

    private init(_ pointer: OpaquePointer?, _ what: String) {
        // Only fails when the default provider cannot load, which no operation would survive.
        guard let pointer else { fatalError("\(what) failed: \(drainOpenSSLErrors().joined(separator: "; "))") }
        self.pointer = pointer
    }
}
