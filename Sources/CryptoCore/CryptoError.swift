internal import COpenSSL

/// The one error type of CryptoCore.
///
/// `description` names the operation and OpenSSL's reason text; it never contains key material,
/// plaintext or signatures, so it is safe to log.
package struct CryptoError: Error, Sendable, CustomStringConvertible {
    package struct Code: Hashable, Sendable, CustomStringConvertible {
        private enum Base: String, Sendable {
            case openSSLFailure
            case invalidKey
            case unsupportedKey
            case invalidParameter
            case authenticationFailure
        }

        private let base: Base
        private init(_ base: Base) { self.base = base }

        /// An OpenSSL call failed for a reason other than the ones below.
        package static let openSSLFailure = Code(.openSSLFailure)
        /// Key bytes or PEM text could not be parsed, or describe an invalid key.
        package static let invalidKey = Code(.invalidKey)
        /// A well-formed key of the wrong kind (not RSA, not P-256, RSA modulus too small).
        package static let unsupportedKey = Code(.unsupportedKey)
        /// A size or format precondition failed (AES key length, nonce length, tag length...).
        package static let invalidParameter = Code(.invalidParameter)
        /// AES-GCM open failed: wrong key, nonce, tag or associated data, or tampered ciphertext.
        package static let authenticationFailure = Code(.authenticationFailure)

        package var description: String { base.rawValue }
    }

    package var code: Code
    /// The operation that failed, usually the OpenSSL function name (`EVP_PKEY_fromdata`).
    package var operation: String
    /// What went wrong, including OpenSSL's error-queue text when there is any.
    package var message: String

    package init(_ code: Code, operation: String, message: String) {
        self.code = code
        self.operation = operation
        self.message = message
    }

    package var description: String { "CryptoError(\(code)): \(operation): \(message)" }
}

extension CryptoError {
    /// Builds an error from OpenSSL's thread-local error queue, draining it so later calls
    /// start clean.
    static func openSSL(_ operation: String, code: Code = .openSSLFailure) -> CryptoError {
        let reasons = drainOpenSSLErrors()
        let message = reasons.isEmpty ? "failed (no OpenSSL error queued)" : reasons.joined(separator: "; ")
        return CryptoError(code, operation: operation, message: message)
    }

    static func invalidParameter(_ operation: String, _ message: String) -> CryptoError {
        CryptoError(.invalidParameter, operation: operation, message: message)
    }
}

/// Returns and clears every entry of OpenSSL's thread-local error queue.
func drainOpenSSLErrors() -> [String] {
    var reasons: [String] = []
    while true {
        let error = ERR_get_error()
        if error == 0 { break }
        var buffer = [CChar](repeating: 0, count: 256)
        ERR_error_string_n(error, &buffer, buffer.count)
        let bytes = buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }
        reasons.append(String(decoding: bytes, as: UTF8.self))
    }
    return reasons
}
