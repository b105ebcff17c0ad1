import CryptoCore
import Testing

@Suite struct Base64URLTests {
    @Test func roundTripsEveryLengthAndByte() {
        let bytes = (0..<300).map { UInt8(truncatingIfNeeded: $0 &* 37 &+ 11) }
        for length in 0...bytes.count {
            let prefix = Array(bytes.prefix(length))
            let encoded = Base64URL.encode(prefix)
            #expect(!encoded.contains("="))
            #expect(Base64URL.decode(encoded) == prefix)
        }
    }

    @Test func knownValues() {
        #expect(Base64URL.encode(Array("{\"alg\":\"RS256\"}".utf8)) == "eyJhbGciOiJSUzI1NiJ9")
        #expect(Base64URL.encode([0xFB, 0xFF]) == "-_8")
        #expect(Base64URL.decode("-_8") == [0xFB, 0xFF])
        #expect(Base64URL.encode([]) == "")
        #expect(Base64URL.decode("") == [])
        #expect(Base64URL.encode(Array("f".utf8)) == "Zg")
        #expect(Base64URL.encode(Array("fo".utf8)) == "Zm8")
        #expect(Base64URL.encode(Array("foo".utf8)) == "Zm9v")
    }

    @Test(arguments: [
        "Zg==", "Zm8=",  // padding
        "+_8", "-/8",  // standard base64 alphabet
        "Zm9v ", " Zm9v", "Zm\n9v",  // whitespace
        "Z",  // 4n+1 length
        "Zh", "Zm9",  // non-zero unused bits ("Zg", "Zm8" are canonical)
        "Zm9v!", "é",
    ])
    func rejects(_ text: String) {
        #expect(Base64URL.decode(text) == nil)
    }

    @Test func decodesSubstrings() {
        let token = "eyJhbGciOiJSUzI1NiJ9.e30"
        let parts = token.split(separator: ".")
        #expect(Base64URL.decode(parts[1]) == Array("{}".utf8))
    }
}
