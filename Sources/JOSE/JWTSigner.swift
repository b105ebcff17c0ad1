package import CryptoCore
internal import Foundation

/// Produces compact JWS strings (RS256 for the fake Apple server and tests, ES256 for our
/// client_secret).
package enum JWTSigner {
    /// `{"alg":"RS256","kid":...}` header; `payload` is the exact claims JSON to sign.
    package static func rs256(payload: [UInt8], keyID: String?, privateKey: RSA.PrivateKey) throws -> String {
        try compact(header: header(algorithm: RS256.algorithm, keyID: keyID), payload: payload) { input in
            try privateKey.rs256Signature(for: input)
        }
    }

    package static func rs256(claims: some Encodable, keyID: String?, privateKey: RSA.PrivateKey) throws -> String {
        try rs256(payload: encode(claims), keyID: keyID, privateKey: privateKey)
    }

    /// `{"alg":"ES256","kid":...}` header; signature is raw R‖S (64 bytes).
    package static func es256(
        payload: [UInt8], keyID: String?, privateKey: P256.Signing.PrivateKey
    ) throws -> String {
        try compact(header: header(algorithm: ES256.algorithm, keyID: keyID), payload: payload) { input in
            try privateKey.es256Signature(for: input)
        }
    }

    package static func es256(
        claims: some Encodable, keyID: String?, privateKey: P256.Signing.PrivateKey
    ) throws -> String {
        try es256(payload: encode(claims), keyID: keyID, privateKey: privateKey)
    }

    /// Header JSON with sorted keys: `{"alg":...,"kid":...,"typ":...}` (absent ones omitted). Written
    /// here, not by `JSONSerialization`, whose key sorting goes through ICU collation on Linux (a
    /// client_secret per Apple call paid for it).
    package static func header(algorithm: String, keyID: String?, type: String? = nil) -> [UInt8] {
        var text: [UInt8] = [UInt8(ascii: "{")]
        for (name, value) in [("alg", algorithm), ("kid", keyID), ("typ", type)] {
            guard let value else { continue }
            if text.count > 1 { text.append(UInt8(ascii: ",")) }
            JSONText.appendString(name, to: &text)
            text.append(UInt8(ascii: ":"))
            JSONText.appendString(value, to: &text)
        }
        text.append(UInt8(ascii: "}"))
        return text
    }

    /// `BASE64URL(header).BASE64URL(payload).BASE64URL(sign(signingInput))`. Tests use it to
    /// build forgeries with arbitrary headers and signatures.
    package static func compact(
        header: [UInt8], payload: [UInt8], sign: ([UInt8]) throws -> [UInt8]
    ) rethrows -> String {
        let signingInput = Base64URL.encode(header) + "." + Base64URL.encode(payload)
        let signature = try sign(Array(signingInput.utf8))
        return signingInput + "." + Base64URL.encode(signature)
    }

    private static func encode(_ claims: some Encodable) throws -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return Array(try encoder.encode(claims))
    }
}

/// Compact JSON text as `JSONSerialization` writes it with `.withoutEscapingSlashes`.
package enum JSONText {
    /// `text` as a JSON string: `"` and `\\` escaped, control characters as `\\n`, `\\r`, `\\t` or `\\u00XX`.
    package static func appendString(_ text: String, to out: inout [UInt8]) {
        // Byte by byte into `out`, no temporary array: this runs for every string of every
        // client_secret and every answer, and a table or literal array here was an allocation each.
        func hexDigit(_ value: UInt8) -> UInt8 { value < 10 ? UInt8(ascii: "0") + value : UInt8(ascii: "a") + value - 10 }
        out.append(UInt8(ascii: "\""))
        for byte in text.utf8 {
            let escaped: UInt8? =
                switch byte {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"): byte
                case 0x0A: UInt8(ascii: "n")
                case 0x0D: UInt8(ascii: "r")
                case 0x09: UInt8(ascii: "t")
                default: nil
                }
            if let escaped {
                out.append(UInt8(ascii: "\\"))
                out.append(escaped)
            } else if byte < 0x20 {
                out.append(contentsOf: "\\u00".utf8)
                out.append(hexDigit(byte >> 4))
                out.append(hexDigit(byte & 0x0F))
            } else {
                out.append(byte)
            }
        }
        out.append(UInt8(ascii: "\""))
    }
}
