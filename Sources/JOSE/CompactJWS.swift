internal import CryptoCore
internal import JSON

/// A parsed (not yet verified) JWS in compact serialization: `header.payload.signature`.
///
/// Parsing checks structure only. Nothing here is trustworthy until a verifier (`RS256.verify`,
/// `ES256.verify`) has accepted the signature.
package struct CompactJWS: Sendable {
    /// Longest accepted token, in bytes. Apple's notifications are about 1 KB.
    package static let maximumLength = 64 * 1024

    /// Header `alg`, nil when absent.
    package let algorithm: String?
    /// Header `kid`, nil when absent.
    package let keyID: String?
    /// Header `typ`, nil when absent.
    package let type: String?
    /// Whether the header carries `crit` (RFC 7515 §4.1.11). No extension is supported, so
    /// verifiers refuse such tokens.
    package let hasCriticalHeader: Bool

    package let headerBytes: [UInt8]
    package let payloadBytes: [UInt8]
    package let signatureBytes: [UInt8]
    /// ASCII bytes of `header.payload` as they appeared in the token: what the signature covers.
    package let signingInput: [UInt8]

    /// Parses `compact`. Throws `JOSEError` with code `.malformed`.
    /// - Parameter checkPayloadIsJSONObject: false when the caller parses the payload itself right
    ///   after (the receiver does), so it is not parsed twice.
    package init(_ compact: some StringProtocol, checkPayloadIsJSONObject: Bool = true) throws {
        // Work on the UTF-8 bytes: splitting a String by Character is far slower, and every byte
        // of a valid token is ASCII anyway.
        let bytes = Array(compact.utf8)
        guard bytes.count <= Self.maximumLength else { throw JOSEError.malformed("token too long") }
        guard let firstDot = bytes.firstIndex(of: UInt8(ascii: ".")),
            let secondDot = bytes[(firstDot + 1)...].firstIndex(of: UInt8(ascii: ".")),
            !bytes[(secondDot + 1)...].contains(UInt8(ascii: "."))
        else { throw JOSEError.malformed("expected three dot-separated parts") }
        guard let header = Base64URL.decode(bytes: bytes[..<firstDot]) else {
            throw JOSEError.malformed("header is not base64url")
        }
        guard let payload = Base64URL.decode(bytes: bytes[(firstDot + 1)..<secondDot]) else {
            throw JOSEError.malformed("payload is not base64url")
        }
        guard let signature = Base64URL.decode(bytes: bytes[(secondDot + 1)...]) else {
            throw JOSEError.malformed("signature is not base64url")
        }

        guard let headerObject = JSONValue.object(header) else {
            throw JOSEError.malformed("header is not a JSON object")
        }
        if checkPayloadIsJSONObject {
            guard JSONValue.object(payload) != nil else { throw JOSEError.malformed("payload is not a JSON object") }
        } else {
            guard !payload.isEmpty else { throw JOSEError.malformed("payload is empty") }
        }

        self.algorithm = try Self.optionalString(headerObject, "alg")
        self.keyID = try Self.optionalString(headerObject, "kid")
        self.type = try Self.optionalString(headerObject, "typ")
        self.hasCriticalHeader = headerObject["crit"] != nil
        self.headerBytes = header
        self.payloadBytes = payload
        self.signatureBytes = signature
        self.signingInput = Array(bytes[..<secondDot])
    }

    private static func optionalString(_ object: [String: JSONValue], _ name: String) throws -> String? {
        guard let value = object[name] else { return nil }
        guard let string = value.stringValue else {
            throw JOSEError.malformed("header \(name) is not a string")
        }
        return string
    }
}
