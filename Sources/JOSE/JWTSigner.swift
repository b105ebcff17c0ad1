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

    /// Header JSON with sorted keys: `{"alg":...,"kid":...,"typ":...}` (absent ones omitted).
    package static func header(algorithm: String, keyID: String?, type: String? = nil) -> [UInt8] {
        var fields = ["alg": algorithm]
        if let keyID { fields["kid"] = keyID }
        if let type { fields["typ"] = type }
        do {
            let data = try JSONSerialization.data(withJSONObject: fields, options: [.sortedKeys, .withoutEscapingSlashes])
            return Array(data)
        } catch {
            fatalError("a [String: String] always serializes: \(error)")
        }
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
