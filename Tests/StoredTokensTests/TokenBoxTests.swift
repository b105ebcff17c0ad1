import StoredTokens
import CryptoCore
import Foundation
import Testing

@Suite struct TokenBoxTests {
    static func keyConfig(_ id: String) -> (String, [UInt8]) {
        let bytes = SecureRandom.bytes(count: 32)
        return ("\(id):\(Data(bytes).base64EncodedString())", bytes)
    }

    @Test func sealsAndOpensWithTheRowAsAssociatedData() throws {
        let box = try TokenBox(configuration: Self.keyConfig("k1").0)
        let stored = try box.seal("r.secret-token", clientID: "com.app", sub: "001.abc")
        #expect(stored[0] == 1)
        #expect(Int(stored[1]) == 2 && Array(stored[2..<4]) == Array("k1".utf8))
        #expect(stored.count == 1 + 1 + 2 + 12 + "r.secret-token".utf8.count + 16)
        #expect(TokenBox.keyID(of: stored) == "k1")
        #expect(try box.open(stored, clientID: "com.app", sub: "001.abc") == "r.secret-token")
        // Fresh nonce every time.
        #expect(try box.seal("r.secret-token", clientID: "com.app", sub: "001.abc") != stored)
    }

    @Test func ciphertextCopiedToAnotherRowDoesNotOpen() throws {
        let box = try TokenBox(configuration: Self.keyConfig("k1").0)
        let stored = try box.seal("token", clientID: "com.app", sub: "alice")
        #expect(throws: TokenBoxError.authenticationFailed) { try box.open(stored, clientID: "com.app", sub: "mallory") }
        #expect(throws: TokenBoxError.authenticationFailed) { try box.open(stored, clientID: "com.other", sub: "alice") }
        // The separator keeps ("ab","c") and ("a","bc") apart.
        let joined = try box.seal("token", clientID: "ab", sub: "c")
        #expect(throws: TokenBoxError.authenticationFailed) { try box.open(joined, clientID: "a", sub: "bc") }
    }

    @Test func rotationFirstKeyEncryptsAllDecrypt() throws {
        let (old, _) = Self.keyConfig("old")
        let (new, _) = Self.keyConfig("new")
        let before = try TokenBox(configuration: old)
        let stored = try before.seal("token", clientID: "c", sub: "s")
        let after = try TokenBox(configuration: "\(new),\(old)")
        #expect(after.currentKeyID == "new")
        #expect(try after.open(stored, clientID: "c", sub: "s") == "token")
        let resealed = try after.seal("token", clientID: "c", sub: "s")
        #expect(TokenBox.keyID(of: resealed) == "new")
        #expect(throws: TokenBoxError.unknownKey("new")) { try before.open(resealed, clientID: "c", sub: "s") }
    }

    @Test func tamperingIsDetected() throws {
        let box = try TokenBox(configuration: Self.keyConfig("k1").0)
        let stored = try box.seal("token", clientID: "c", sub: "s")
        for index in 4..<stored.count {
            var tampered = stored
            tampered[index] ^= 0x01
            #expect(throws: TokenBoxError.authenticationFailed) { try box.open(tampered, clientID: "c", sub: "s") }
        }
        #expect(throws: TokenBoxError.malformed) { try box.open([2] + stored.dropFirst(), clientID: "c", sub: "s") }
        #expect(throws: TokenBoxError.malformed) { try box.open(Array(stored.prefix(10)), clientID: "c", sub: "s") }
    }

    @Test func badConfigurationNamesNoSecret() {
        let secret = Data(SecureRandom.bytes(count: 16)).base64EncodedString()
        for text in ["", "nokey", "k1:\(secret)", "k1:%%%", "k1:\(Data(count: 32).base64EncodedString()),k1:\(Data(count: 32).base64EncodedString())"] {
            do {
                _ = try TokenBox(configuration: text)
                Issue.record("accepted \(text)")
            } catch {
                #expect(!"\(error)".contains(secret))
            }
        }
    }
}
