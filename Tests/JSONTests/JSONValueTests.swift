import Foundation
import JSON
import Testing

@Suite struct JSONValueTests {
    @Test func readsEveryKindOfValue() throws {
        let text = #" { "s": "a\"b\\c\/d\n\u00e9\ud83d\ude00", "n": -12.5e2, "z": 0, "t": true, "f": false, "x": null, "a": [1, [], {}] } "#
        let value = try JSONValue.parse(Array(text.utf8))
        #expect(value["s"] == .string("a\"b\\c/d\né😀"))
        #expect(value["n"] == .number(-1250))
        #expect(value["z"] == .number(0))
        #expect(value["t"] == .bool(true))
        #expect(value["f"] == .bool(false))
        #expect(value["x"] == .null)
        #expect(value["a"] == .array([.number(1), .array([]), .object([:])]))
        #expect(value["missing"] == nil)
    }

    @Test func appleClaimsReadTheSameAsFoundationReadsThem() throws {
        let claims = #"{"iss":"https://appleid.apple.com","aud":"com.example.app","iat":1508184845,"jti":"x-1","events":"{\"type\":\"email-disabled\",\"sub\":\"001.a\",\"email\":\"a@privaterelay.appleid.com\",\"is_private_email\":\"true\",\"event_time\":1508184845123}"}"#
        let ours = try JSONValue.parse(Array(claims.utf8))
        let foundation = try #require(try JSONSerialization.jsonObject(with: Data(claims.utf8)) as? [String: Any])
        #expect(ours["iss"]?.stringValue == foundation["iss"] as? String)
        #expect(ours["events"]?.stringValue == foundation["events"] as? String)
        #expect(ours["iat"]?.numberValue == (foundation["iat"] as? NSNumber)?.doubleValue)
        let nested = try JSONValue.parse(Array(try #require(ours["events"]?.stringValue).utf8))
        #expect(nested["event_time"] == .number(1_508_184_845_123))
    }

    @Test(arguments: [
        "", " ", "{", "}", "[1,]", "{\"a\":1,}", "{\"a\" 1}", "{a:1}", "{'a':1}", "[1 2]", "01", "-", "1.", ".5", "1e",
        "+1", "tru", "nul", "True", "NaN", "Infinity", "1e400", "\"abc", "\"\\x\"", "\"\\u12\"", "\"\\ud800\"",
        "\"\\udc00\"", "\"\\ud800\\u0041\"", "\"a\tb\"", "{} {}", "[] x", "\u{FEFF}{}",
    ])
    func rejectsWhatRFC8259Rejects(text: String) {
        #expect(throws: JSONParseError.self, "\(text.debugDescription)") { try JSONValue.parse(Array(text.utf8)) }
    }

    @Test func rejectsInvalidUTF8InStrings() {
        for bytes: [UInt8] in [[0x22, 0xFF, 0x22], [0x22, 0xC3, 0x22], [0x22, 0xED, 0xA0, 0x80, 0x22]] {
            #expect(throws: JSONParseError.self, "\(bytes)") { try JSONValue.parse(bytes) }
        }
    }

    @Test func escapedStringsKeepEveryRunAndCheckEachOne() throws {
        let text = #""é\"ü\u00e9x\\y😀\n\ud83d\ude00""#
        #expect(try JSONValue.parse(Array(text.utf8)) == .string("é\"üéx\\y😀\n😀"))
        // Invalid UTF-8 in the run after an escape, and in the run before one: refused where that run starts.
        for (bytes, offset): ([UInt8], Int) in [([0x22, 0x61, 0x5C, 0x6E, 0xC3, 0x22], 4), ([0x22, 0x61, 0xC3, 0x5C, 0x6E, 0x22], 1)] {
            let error = #expect(throws: JSONParseError.self) { try JSONValue.parse(bytes) }
            #expect(error?.reason == "invalid UTF-8 in a string" && error?.offset == offset, "\(bytes)")
        }
    }

    @Test func rejectsDuplicateMemberNamesAnywhere() {
        for text in [#"{"alg":"RS256","alg":"none"}"#, #"{"a":{"b":1,"b":2}}"#, #"[{"k":1,"k":1}]"#] {
            let error = #expect(throws: JSONParseError.self) { try JSONValue.parse(Array(text.utf8)) }
            #expect(error?.reason.hasPrefix("duplicate member name") == true, "\(String(describing: error))")
        }
    }

    @Test func boundsNesting() throws {
        let deepest = String(repeating: "[", count: JSONValue.maximumDepth) + String(repeating: "]", count: JSONValue.maximumDepth)
        _ = try JSONValue.parse(Array(deepest.utf8))
        let tooDeep = "[" + deepest + "]"
        #expect(throws: JSONParseError.self) { try JSONValue.parse(Array(tooDeep.utf8)) }
        let hostile = String(repeating: "{\"a\":", count: 100_000)
        #expect(throws: JSONParseError.self) { try JSONValue.parse(Array(hostile.utf8)) }
    }

    @Test func errorsSayWhere() {
        let error = #expect(throws: JSONParseError.self) { try JSONValue.parse(Array(#"{"a":[1,2,x]}"#.utf8)) }
        #expect(error?.offset == 10)
        #expect(error?.description.contains("byte 10") == true)
    }

    /// Numbers agree with Foundation's reading, to the bit.
    @Test(arguments: ["0", "-0", "1", "-1", "9007199254740993", "1508184845123", "0.1", "1e-7", "2.5E+3", "123.456e-2"])
    func numbersMatchFoundation(text: String) throws {
        let ours = try JSONValue.parse(Array("[\(text)]".utf8))
        let theirs = try #require(try JSONSerialization.jsonObject(with: Data("[\(text)]".utf8)) as? [NSNumber])
        #expect(ours == .array([.number(theirs[0].doubleValue)]))
    }

    @Test func objectHelperRefusesNonObjects() {
        #expect(JSONValue.object(Array("[1]".utf8)) == nil)
        #expect(JSONValue.object(Array("\"s\"".utf8)) == nil)
        #expect(JSONValue.object(Array("{\"a\":1}".utf8)) == ["a": .number(1)])
        #expect(JSONValue.object(Array("{\"a\":1".utf8)) == nil)
    }
}
