import CryptoCore
import Testing

/// Test cases 13–16 of McGrew & Viega, "The Galois/Counter Mode of Operation" (AES-256).
@Suite struct AESGCMTests {
    static let key15 = hex("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308")
    static let nonce15 = hex("cafebabefacedbaddecaf888")
    static let plaintext15 = hex(
        "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72"
            + "1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b391aafd255")
    static let ciphertext15 = hex(
        "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa"
            + "8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662898015ad")

    @Test func testCase13() throws {
        let box = try AESGCM.seal([], key: [UInt8](repeating: 0, count: 32), nonce: [UInt8](repeating: 0, count: 12), authenticating: [])
        #expect(box.ciphertext.isEmpty)
        #expect(hexString(box.tag) == "530f8afbc74536b9a963b4f1c4cb738b")
        #expect(try AESGCM.open(box, key: [UInt8](repeating: 0, count: 32), authenticating: []) == [])
    }

    @Test func testCase14() throws {
        let box = try AESGCM.seal(
            [UInt8](repeating: 0, count: 16), key: [UInt8](repeating: 0, count: 32),
            nonce: [UInt8](repeating: 0, count: 12), authenticating: [])
        #expect(hexString(box.ciphertext) == "cea7403d4d606b6e074ec5d3baf39d18")
        #expect(hexString(box.tag) == "d0d1c8a799996bf0265b98b5d48ab919")
    }

    @Test func testCase15() throws {
        let box = try AESGCM.seal(Self.plaintext15, key: Self.key15, nonce: Self.nonce15, authenticating: [])
        #expect(box.ciphertext == Self.ciphertext15)
        #expect(hexString(box.tag) == "b094dac5d93471bdec1a502270e3cc6c")
        #expect(try AESGCM.open(box, key: Self.key15, authenticating: []) == Self.plaintext15)
    }

    @Test func testCase16() throws {
        let aad = hex("feedfacedeadbeeffeedfacedeadbeefabaddad2")
        let plaintext = Array(Self.plaintext15.prefix(60))
        let box = try AESGCM.seal(plaintext, key: Self.key15, nonce: Self.nonce15, authenticating: aad)
        #expect(box.ciphertext == Array(Self.ciphertext15.prefix(60)))
        #expect(hexString(box.tag) == "76fc6ece0f4e1768cddf8853bb2d551b")
        #expect(try AESGCM.open(box, key: Self.key15, authenticating: aad) == plaintext)
    }

    @Test func combinedRoundTripWithRandomNonce() throws {
        let key = SecureRandom.bytes(count: 32)
        let first = try AESGCM.seal(Array("refresh-token".utf8), key: key, authenticating: Array("user-1".utf8))
        let second = try AESGCM.seal(Array("refresh-token".utf8), key: key, authenticating: Array("user-1".utf8))
        #expect(first.nonce.count == 12)
        #expect(first.nonce != second.nonce)
        #expect(first.combined.count == 12 + 13 + 16)
        let reopened = try AESGCM.SealedBox(combined: first.combined)
        #expect(reopened == first)
        #expect(try AESGCM.open(reopened, key: key, authenticating: Array("user-1".utf8)) == Array("refresh-token".utf8))
    }

    @Test func tamperingFails() throws {
        let key = SecureRandom.bytes(count: 32)
        let aad = Array("user-1".utf8)
        let box = try AESGCM.seal(Array("secret value".utf8), key: key, authenticating: aad)
        var combined = box.combined

        func expectAuthenticationFailure(_ box: AESGCM.SealedBox, key: [UInt8], aad: [UInt8]) {
            let error = #expect(throws: CryptoError.self) { try AESGCM.open(box, key: key, authenticating: aad) }
            #expect(error?.code == .authenticationFailure)
        }

        combined[12] ^= 0x01  // ciphertext
        expectAuthenticationFailure(try AESGCM.SealedBox(combined: combined), key: key, aad: aad)
        combined[12] ^= 0x01
        combined[combined.count - 1] ^= 0x80  // tag
        expectAuthenticationFailure(try AESGCM.SealedBox(combined: combined), key: key, aad: aad)
        combined[combined.count - 1] ^= 0x80
        combined[0] ^= 0x01  // nonce
        expectAuthenticationFailure(try AESGCM.SealedBox(combined: combined), key: key, aad: aad)
        expectAuthenticationFailure(box, key: key, aad: Array("user-2".utf8))
        expectAuthenticationFailure(box, key: key, aad: [])
        expectAuthenticationFailure(box, key: SecureRandom.bytes(count: 32), aad: aad)
    }

    @Test func rejectsBadSizes() {
        #expect(throws: CryptoError.self) { try AESGCM.seal([1], key: [UInt8](repeating: 0, count: 16), authenticating: []) }
        #expect(throws: CryptoError.self) { try AESGCM.seal([1], key: [UInt8](repeating: 0, count: 32), nonce: [0, 1], authenticating: []) }
        #expect(throws: CryptoError.self) { try AESGCM.SealedBox(combined: [UInt8](repeating: 0, count: 27)) }
        #expect(throws: Never.self) { try AESGCM.SealedBox(combined: [UInt8](repeating: 0, count: 28)) }
    }
}
