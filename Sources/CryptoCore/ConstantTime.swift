internal import COpenSSL

/// Comparisons whose duration does not depend on where two secrets first differ.
package enum ConstantTime {
    /// Whether `a` and `b` are equal. The length is not secret (it leaks through the comparison's
    /// duration); the contents are compared with `CRYPTO_memcmp`.
    package static func equals(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        if a.isEmpty { return true }
        return CRYPTO_memcmp(a, b, a.count) == 0
    }
}
