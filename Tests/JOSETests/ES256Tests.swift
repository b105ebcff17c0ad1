import CryptoCore
import JOSE
import Testing

@Suite struct ES256Tests {
    @Test func clientSecretSignsAndVerifies() throws {
        let key = try P256.Signing.PrivateKey.generate()
        struct Claims: Codable { var iss: String; var iat: Int; var exp: Int; var aud: String; var sub: String }
        let token = try JWTSigner.es256(
            claims: Claims(iss: "TEAMID1234", iat: 1, exp: 301, aud: "https://appleid.apple.com", sub: "com.example"),
            keyID: "ABC123DEFG", privateKey: key)
        let jws = try CompactJWS(token)
        #expect(jws.algorithm == "ES256")
        #expect(jws.keyID == "ABC123DEFG")
        #expect(jws.headerBytes == Array(#"{"alg":"ES256","kid":"ABC123DEFG"}"#.utf8))
        #expect(jws.signatureBytes.count == 64)
        try ES256.verify(jws, publicKey: key.publicKey)

        let other = try P256.Signing.PrivateKey.generate()
        let error = #expect(throws: JOSEError.self) { try ES256.verify(jws, publicKey: other.publicKey) }
        #expect(error?.code == .badSignature)
    }

    @Test func es256RefusesOtherAlgorithms() throws {
        let key = try P256.Signing.PrivateKey.generate()
        let token = try JWTSigner.compact(header: Array(#"{"alg":"ES384"}"#.utf8), payload: Array("{}".utf8)) {
            try key.es256Signature(for: $0)
        }
        let error = #expect(throws: JOSEError.self) { try ES256.verify(try CompactJWS(token), publicKey: key.publicKey) }
        #expect(error?.code == .unsupportedAlgorithm("ES384"))
    }

    @Test func rfc7515AppendixA3Verifies() throws {
        let key = try #require(
            JSONWebKey(
                keyType: "EC", curve: "P-256", x: "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
                y: "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"
            ).p256PublicKey())
        let token =
            "eyJhbGciOiJFUzI1NiJ9.eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkzODAsDQogImh0dHA6Ly9leGFt"
            + "cGxlLmNvbS9pc19yb290Ijp0cnVlfQ.DtEhU3ljbEg8L38VWAfUAqOyKAM6-Xx-F4GawxaepmXFCgfTjDxw5djx"
            + "La8ISlSApmWQxfKTUJqPP3-Kg6NU1Q"
        try ES256.verify(try CompactJWS(token), publicKey: key)
    }
}
