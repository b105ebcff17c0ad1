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
        "!m9v", "Zm9!", "Zm9vZ!", "Zm9vZm!", "Zm9vZh", "Zm9vZm9",  // in a full group, in the partial one after it
    ])
    func rejects(_ text: String) {
        #expect(Base64URL.decode(text) == nil)
    }

    @Test func decodesSubstrings() {
        let token = "eyJhbGciOiJSUzI1NiJ9.e30"
        let parts = token.split(separator: ".")
        #expect(Base64URL.decode(parts[1]) == Array("{}".utf8))
    }

    /// Every byte in every position of strings of 2 to 8 characters (full groups and partial ones),
    /// against a reference that decodes a bit at a time: the same strings accepted, the same bytes.
    @Test func agreesWithABitAtATimeDecoder() {
        let fillers: [[UInt8]] = [Array("AAAAAAAA".utf8), Array("_-9zQg8w".utf8)]
        for filler in fillers {
            for length in 2...8 where length % 4 != 1 {
                for position in 0..<length {
                    for byte in 0...255 {
                        var text = Array(filler.prefix(length))
                        text[position] = UInt8(byte)
                        #expect(Base64URL.decode(bytes: text[...]) == referenceDecode(text), "\(text) at \(position)")
                    }
                }
            }
        }
    }

    private func referenceDecode(_ text: [UInt8]) -> [UInt8]? {
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)
        if text.count % 4 == 1 { return nil }
        var bits: [Bool] = []
        for character in text {
            guard let value = alphabet.firstIndex(of: character) else { return nil }
            bits += (0..<6).map { value >> (5 - $0) & 1 == 1 }
        }
        let whole = bits.count / 8 * 8
        if bits[whole...].contains(true) { return nil }
        return stride(from: 0, to: whole, by: 8).map { start in
            bits[start..<start + 8].reduce(UInt8(0)) { $0 << 1 | ($1 ? 1 : 0) }
        }
    }
}
