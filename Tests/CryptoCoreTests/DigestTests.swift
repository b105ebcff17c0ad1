import CryptoCore
import Testing

@Suite struct DigestTests {
    @Test func sha256OfABC() {
        #expect(
            hexString(SHA256.hash(Array("abc".utf8)))
                == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    }

    @Test func sha256OfEmpty() {
        #expect(
            hexString(SHA256.hash([]))
                == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
    }

    /// RFC 4231 test case 2.
    @Test func hmacRFC4231Case2() {
        let mac = HMACSHA256.authenticationCode(
            for: Array("what do ya want for nothing?".utf8), key: Array("Jefe".utf8))
        #expect(hexString(mac) == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
        #expect(HMACSHA256.isValidAuthenticationCode(mac, for: Array("what do ya want for nothing?".utf8), key: Array("Jefe".utf8)))
        #expect(!HMACSHA256.isValidAuthenticationCode(mac, for: Array("what do ya want for nothing!".utf8), key: Array("Jefe".utf8)))
    }

    @Test func hmacWithEmptyKeyWorks() {
        #expect(HMACSHA256.authenticationCode(for: [1, 2, 3], key: []).count == 32)
    }

    @Test func secureRandom() {
        #expect(SecureRandom.bytes(count: 0).isEmpty)
        let a = SecureRandom.bytes(count: 32)
        let b = SecureRandom.bytes(count: 32)
        #expect(a.count == 32)
        #expect(a != b)
    }
}
