internal import COpenSSL

/// Cryptographically secure random bytes from OpenSSL's DRBG.
package enum SecureRandom {
    package static func bytes(count: Int) -> [UInt8] {
        precondition(count >= 0 && count <= Int(Int32.max), "SecureRandom.bytes: invalid count")
        if count == 0 { return [] }
        var bytes = [UInt8](repeating: 0, count: count)
        guard RAND_bytes(&bytes, Int32(count)) == 1 else {
            // Without randomness nothing we do (nonces, keys) is safe: stop rather than continue.
            fatalError("RAND_bytes failed: \(drainOpenSSLErrors().joined(separator: "; "))")
        }
        return bytes
    }
}
