/// The one error type of JOSE.
///
/// `description` never contains token content (algorithm names, key IDs and header values are
/// attacker-controlled): it is safe to log and to return. `debugDescription` adds the offending
/// value, escaped and truncated, for local debugging.
package struct JOSEError: Error, Sendable, Equatable, CustomStringConvertible, CustomDebugStringConvertible {
    package enum Code: Sendable, Equatable {
        /// Not three parts, a part is not base64url, header/payload not a JSON object,
        /// a header field of the wrong type, or an unsupported `crit` header.
        case malformed
        /// `alg` is not the one algorithm the caller pinned; nil when `alg` is missing.
        case unsupportedAlgorithm(String?)
        /// `kid` is missing (nil) or names no known key.
        case unknownKey(String?)
        /// The signature does not verify with the selected key.
        case badSignature
    }

    package var code: Code
    /// Fixed explanation written by this module (never token content).
    package var reason: String

    package init(_ code: Code, reason: String) {
        self.code = code
        self.reason = reason
    }

    static func malformed(_ reason: String) -> JOSEError { JOSEError(.malformed, reason: reason) }

    package var description: String {
        switch code {
        case .malformed: "JOSE: malformed token: \(reason)"
        case .unsupportedAlgorithm: "JOSE: unsupported algorithm: \(reason)"
        case .unknownKey: "JOSE: unknown key: \(reason)"
        case .badSignature: "JOSE: bad signature: \(reason)"
        }
    }

    package var debugDescription: String {
        switch code {
        case .unsupportedAlgorithm(let algorithm?): "\(description) (alg \(Self.sanitized(algorithm)))"
        case .unknownKey(let keyID?): "\(description) (kid \(Self.sanitized(keyID)))"
        default: description
        }
    }

    /// Printable ASCII only, at most 64 characters.
    private static func sanitized(_ value: String) -> String {
        let printable = value.unicodeScalars.prefix(64).map { scalar in
            (0x20..<0x7F).contains(scalar.value) ? String(scalar) : "?"
        }
        return "\"" + printable.joined() + (value.unicodeScalars.count > 64 ? "…" : "") + "\""
    }
}
