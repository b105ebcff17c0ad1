import Foundation
import JOSE
import Testing

/// `JSONText.appendString` writes the strings of every client_secret and every app API answer.
@Suite struct JSONTextTests {
    private func written(_ text: String) -> String {
        var out: [UInt8] = Array("x".utf8)  // appended to what is there, never replacing it
        JSONText.appendString(text, to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    @Test func escapesWhatJSONRequiresAndNothingElse() {
        #expect(written("plain/text-é€😀") == "x\"plain/text-é€😀\"")
        #expect(written("a\"b\\c") == #"x"a\"b\\c""#)
        #expect(written("\n\r\t") == #"x"\n\r\t""#)
        #expect(written("\u{0}\u{1}\u{8}\u{C}\u{1F} ") == #"x"\u0000\u0001\u0008\u000c\u001f ""#)
        #expect(written("") == "x\"\"")
    }

    /// Every one-character string from U+0000 to U+00FF reads back as itself through Foundation's
    /// JSON reader (an escape written wrong, or a control character left raw, does not).
    @Test func everyLowCharacterRoundTrips() throws {
        for value in 0...0xFF {
            let text = String(UnicodeScalar(UInt8(value)))
            var out: [UInt8] = Array("[".utf8)
            JSONText.appendString(text, to: &out)
            out += Array("]".utf8)
            let read = try JSONSerialization.jsonObject(with: Data(out)) as? [String]
            #expect(read == [text], "U+\(String(value, radix: 16))")
        }
    }
}
