internal import COpenSSL

/// SHA-256 (FIPS 180-4).
package enum SHA256 {
    package static let byteCount = 32

    package static func hash(_ bytes: [UInt8]) -> [UInt8] {
        var digest = [UInt8](repeating: 0, count: Int(EVP_MAX_MD_SIZE))
        var length: UInt32 = 0
        guard EVP_Digest(bytes, bytes.count, &digest, &length, EVP_sha256(), nil) == 1 else {
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
