import CryptoCore
import JOSE
import JSON
import Testing

@Suite struct CompactJWSTests {
    static func part(_ json: String) -> String { Base64URL.encode(Array(json.utf8)) }

    @Test func parsesFields() throws {
        let token = Self.part(#"{"alg":"RS256","kid":"K1","typ":"JWT"}"#) + "." + Self.part(#"{"iss":"x"}"#) + ".AQID"
        let jws = try CompactJWS(token)
        #expect(jws.algorithm == "RS256")
        #expect(jws.keyID == "K1")
        #expect(jws.type == "JWT")
        #expect(!jws.hasCriticalHeader)
        #expect(jws.payloadBytes == Array(#"{"iss":"x"}"#.utf8))
        #expect(jws.signatureBytes == [1, 2, 3])
        #expect(jws.signingInput == Array(token.split(separator: ".")[0...1].joined(separator: ".").utf8))
        #expect(JSONValue.object(jws.payloadBytes)?["iss"]?.stringValue == "x")
    }

    @Test func emptySignatureParses() throws {
        let jws = try CompactJWS(Self.part(#"{"alg":"none"}"#) + "." + Self.part("{}") + ".")
        #expect(jws.signatureBytes.isEmpty)
        #expect(jws.algorithm == "none")
    }

    static let header = part(#"{"alg":"RS256","kid":"K1"}"#)
    static let payload = part(#"{"sub":"1"}"#)

    @Test(arguments: [
        "",
        "abc",
        header + "." + payload,  // two parts
        header + "." + payload + ".AQID.AQID",  // four parts
        header + "." + payload + ".AQID.",  // four parts, last empty
        header + ".." + "AQID",  // empty payload
        "." + payload + ".AQID",  // empty header
        header + "=." + payload + ".AQID",  // padding
        header + "." + payload + ".AQ+D",  // standard-alphabet char
        header + "." + payload + ".A",  // impossible length
        header + "." + payload + ".AQ ID",  // whitespace
        part("not json") + "." + payload + ".AQID",
        part(#"["alg","RS256"]"#) + "." + payload + ".AQID",  // header JSON array
        part(#""RS256""#) + "." + payload + ".AQID",  // header JSON string
        header + "." + part("[1,2]") + ".AQID",  // payload JSON array
        header + "." + part("not json") + ".AQID",
        part(#"{"alg":256}"#) + "." + payload + ".AQID",  // alg not a string
        part(#"{"alg":"RS256","kid":7}"#) + "." + payload + ".AQID",  // kid not a string
        part(#"{"alg":"RS256","kid":"K1","alg":"none"}"#) + "." + payload + ".AQID",  // duplicate alg
        header + "." + part(#"{"sub":"1","sub":"2"}"#) + ".AQID",  // duplicate claim
    ])
    func rejectsMalformed(_ token: String) {
        let error = #expect(throws: JOSEError.self) { try CompactJWS(token) }
        #expect(error?.code == .malformed)
    }

    @Test func rejectsOverlongTokens() {
        let token = Self.header + "." + Self.part("{\"a\":\"" + String(repeating: "x", count: 70_000) + "\"}") + ".AQID"
        #expect(throws: JOSEError.self) { try CompactJWS(token) }
    }

    @Test func descriptionHasNoTokenContent() {
        let error = JOSEError(.unsupportedAlgorithm("evil-alg-value"), reason: "only RS256 is accepted")
        #expect(!error.description.contains("evil"))
        #expect(error.debugDescription.contains("evil-alg-value"))
        let unknown = JOSEError(.unknownKey("secret-kid"), reason: "no key with this kid")
        #expect(!unknown.description.contains("secret-kid"))
    }
}
