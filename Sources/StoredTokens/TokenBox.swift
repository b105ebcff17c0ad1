import CryptoCore
import Foundation

/// Refresh tokens at rest: AES-256-GCM with a random 96-bit nonce and the row's identity
/// (`client_id ‖ 0x00 ‖ sub`) as associated data, so a ciphertext copied to another row does not open.
///
/// Stored value: `0x01` (version) ‖ key-id length (1 byte) ‖ key id (UTF-8) ‖ nonce ‖ ciphertext ‖ tag.
/// Keys come from `SIWA_TOKEN_KEYS` (`id:base64(32 bytes)`, comma-separated): the first encrypts,
/// every one decrypts, so keys rotate by putting the new one first and re-encrypting.
package struct TokenBox: Sendable {
    package static let version: UInt8 = 1

    package struct Key: Sendable {
        package var id: String
        /// Secret: never log it.
        package var bytes: [UInt8]
        package init(id: String, bytes: [UInt8]) {
            self.id = id
            self.bytes = bytes
        }
    }

    package let keys: [Key]
    package var currentKeyID: String { keys[0].id }

    package init(keys: [Key]) throws(TokenBoxError) {
        guard !keys.isEmpty else { throw .configuration("no key") }
        var seen: Set<String> = []
        for key in keys {
            guard Self.isValidKeyID(key.id) else {
                throw .configuration("key id must be 1-64 characters of A-Z a-z 0-9 . _ -")
            }
            guard key.bytes.count == AESGCM.keyByteCount else {
                throw .configuration("key \(key.id) must be base64 of 32 bytes")
            }
            guard seen.insert(key.id).inserted else { throw .configuration("key id \(key.id) appears twice") }
        }
        self.keys = keys
    }

    /// Parses `id:base64,id:base64`. Errors name the key id, never key material.
    package init(configuration text: String) throws(TokenBoxError) {
        var keys: [Key] = []
        for item in text.split(separator: ",") {
            let item = item.trimmingCharacters(in: .whitespacesAndNewlines)
            guard !item.isEmpty else { continue }
            guard let colon = item.firstIndex(of: ":") else { throw .configuration("each key must be id:base64") }
            let id = String(item[..<colon])
            guard let data = Data(base64Encoded: String(item[item.index(after: colon)...])) else {
                throw .configuration("key \(id) is not base64")
            }
            keys.append(Key(id: id, bytes: Array(data)))
        }
        try self.init(keys: keys)
    }

    static func isValidKeyID(_ id: String) -> Bool {
        !id.isEmpty && id.utf8.count <= 64
            && id.unicodeScalars.allSatisfy { $0.isASCII && ($0.properties.isAlphabetic || ("0"..."9").contains($0) || "._-".unicodeScalars.contains($0)) }
    }

    static func associatedData(clientID: String, sub: String) -> [UInt8] {
        Array(clientID.utf8) + [0] + Array(sub.utf8)
    }

    /// Encrypts `token` for the row `(clientID, sub)` with the first key.
    package func seal(_ token: String, clientID: String, sub: String) throws -> [UInt8] {
        let key = keys[0]
        let box = try AESGCM.seal(Array(token.utf8), key: key.bytes, authenticating: Self.associatedData(clientID: clientID, sub: sub))
        let id = Array(key.id.utf8)
        return [Self.version, UInt8(id.count)] + id + box.combined
    }

    /// Decrypts a stored value for the row `(clientID, sub)`.
    package func open(_ stored: [UInt8], clientID: String, sub: String) throws(TokenBoxError) -> String {
        guard let (keyID, combined) = Self.split(stored) else { throw .malformed }
        guard let key = keys.first(where: { $0.id == keyID }) else { throw .unknownKey(keyID) }
        guard let box = try? AESGCM.SealedBox(combined: combined),
            let plaintext = try? AESGCM.open(box, key: key.bytes, authenticating: Self.associatedData(clientID: clientID, sub: sub))
        else { throw .authenticationFailed }
        guard let token = String(validating: plaintext, as: UTF8.self) else { throw .malformed }
        return token
    }

    /// The key id a stored value was sealed with, or nil if it is not a version-1 value.
    package static func keyID(of stored: [UInt8]) -> String? { split(stored)?.keyID }

    private static func split(_ stored: [UInt8]) -> (keyID: String, combined: [UInt8])? {
        guard stored.count >= 2, stored[0] == version else { return nil }
        let length = Int(stored[1])
        let start = 2 + length
        guard length > 0, stored.count >= start + AESGCM.nonceByteCount + AESGCM.tagByteCount,
            let keyID = String(validating: stored[2..<start], as: UTF8.self)
        else { return nil }
        return (keyID, Array(stored[start...]))
    }
}

/// Why a token could not be sealed or opened. Never carries token or key bytes.
package enum TokenBoxError: Error, Sendable, Equatable, CustomStringConvertible {
    case configuration(String)
    case malformed
    case unknownKey(String)
    case authenticationFailed

    package var description: String {
        switch self {
        case .configuration(let why): "SIWA_TOKEN_KEYS: \(why)"
        case .malformed: "stored token is malformed"
        case .unknownKey(let id): "stored token uses key \(id), which SIWA_TOKEN_KEYS does not hold"
        case .authenticationFailed: "stored token does not open for this row (wrong key, copied or tampered)"
        }
    }
}
