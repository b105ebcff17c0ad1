import CryptoCore
import JOSE
import Testing

@Suite struct JSONWebKeySetTests {
    static let n = RS256Tests.rfcModulus

    @Test func keepsRS256KeysAndSkipsOthers() throws {
        let json = """
            {"keys":[
              {"kty":"RSA","kid":"rs256","use":"sig","alg":"RS256","n":"\(Self.n)","e":"AQAB"},
              {"kty":"RSA","kid":"no-alg-no-use","n":"\(Self.n)","e":"AQAB"},
              {"kty":"EC","kid":"ec","use":"sig","alg":"ES256","crv":"P-256",
               "x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"},
              {"kty":"RSA","kid":"rs512","use":"sig","alg":"RS512","n":"\(Self.n)","e":"AQAB"},
              {"kty":"RSA","kid":"enc","use":"enc","alg":"RS256","n":"\(Self.n)","e":"AQAB"},
              {"kty":"RSA","kid":"small","alg":"RS256","n":"\(String(Self.n.prefix(172)))","e":"AQAB"},
              {"kty":"RSA","kid":"bad-n","alg":"RS256","n":"!!","e":"AQAB"},
              {"kty":"RSA","alg":"RS256","n":"\(Self.n)","e":"AQAB"},
              {"kty":"RSA","kid":42,"alg":"RS256","n":"\(Self.n)","e":"AQAB"},
              "not an object",
              {"kid":"no-kty"}
            ]}
            """
        let set = try JSONWebKeySet(jsonBytes: Array(json.utf8))
        #expect(set.keys.count == 9)
        let keys = set.rs256Keys()
        #expect(Set(keys.keys) == ["rs256", "no-alg-no-use"])
        let jws = try CompactJWS(RS256Tests.rfcToken)
        try RS256.verify(jws, publicKey: try #require(keys["rs256"]))
        #expect(set.keys.first { $0.keyID == "ec" }?.p256PublicKey() != nil)
    }

    @Test(arguments: ["", "[]", #"{"keys":{}}"#, #"{"key":[]}"#, "not json"])
    func rejectsNonJWKSDocuments(_ json: String) {
        let error = #expect(throws: JOSEError.self) { try JSONWebKeySet(jsonBytes: Array(json.utf8)) }
        #expect(error?.code == .malformed)
    }

    @Test func encodesForTheFakeAppleServer() throws {
        let first = try RSA.PrivateKey.generate()
        let second = try RSA.PrivateKey.generate()
        let set = JSONWebKeySet(keys: [
            JSONWebKey(rs256: first.publicKey, keyID: "fake-1"),
            JSONWebKey(rs256: second.publicKey, keyID: "fake-2"),
        ])
        let json = String(decoding: set.jsonBytes(), as: UTF8.self)
        #expect(json.hasPrefix(#"{"keys":[{"alg":"RS256","e":"AQAB","kid":"fake-1","kty":"RSA","n":""#))
        #expect(json.contains(#""use":"sig""#))

        let decoded = try JSONWebKeySet(jsonBytes: Array(json.utf8))
        #expect(decoded == set)
        let keys = decoded.rs256Keys()
        let token = try JWTSigner.rs256(payload: Array("{}".utf8), keyID: "fake-2", privateKey: second)
        try RS256.verify(try CompactJWS(token), keys: keys)
        let wrongKid = try JWTSigner.rs256(payload: Array("{}".utf8), keyID: "fake-1", privateKey: second)
        #expect(throws: JOSEError.self) { try RS256.verify(try CompactJWS(wrongKid), keys: keys) }
    }
}
