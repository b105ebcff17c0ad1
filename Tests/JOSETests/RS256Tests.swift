import CryptoCore
import JOSE
import JSON
import Testing

@Suite struct RS256Tests {
    // MARK: RFC 7515 Appendix A.2

    static let rfcModulus =
        "ofgWCuLjybRlzo0tZWJjNiuSfb4p4fAkd_wWJcyQoTbji9k0l8W26mPddxHmfHQp-Vaw-4qPCJrcS2mJPM"
        + "EzP1Pt0Bm4d4QlL-yRT-SFd2lZS-pCgNMsD1W_YpRPEwOWvG6b32690r2jZ47soMZo9wGzjb_7OMg0LOL-"
        + "bSf63kpaSHSXndS5z5rexMdbBYUsLA9e-KXBdQOS-UTo7WTBEMa2R2CapHg665xsmtdVMTBQY4uDZlxvb3"
        + "qCo5ZwKh9kG4LT6_I5IhlJH7aGhyxXFvUK-DWNmoudF8NAco9_h9iaGNj8q2ethFkMLs91kzk2PAcDTW9g"
        + "b54h4FRWyuXpoQ"

    static let rfcToken =
        "eyJhbGciOiJSUzI1NiJ9"
        + ".eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkzODAsDQogImh0dHA6Ly9leGFtcGxlLmNvbS9pc19yb290Ijp0cnVlfQ"
        + ".cC4hiUPoj9Eetdgtv3hF80EGrhuB__dzERat0XF9g2VtQgr9PJbu3XOiZj5RZmh7"
        + "AAuHIm4Bh-0Qc_lF5YKt_O8W2Fp5jujGbds9uJdbF9CUAr7t1dnZcAcQjbKBYNX4"
        + "BAynRFdiuB--f_nZLgrnbyTyWzO75vRK5h6xBArLIARNPvkSjtQBMHlb1L07Qe7K"
        + "0GarZRmB_eSN9383LcOLn6_dO--xi12jzDwusC-eOkHWEsqtFZESc6BfI7noOPqv"
        + "hJ1phCnvWh6IeYI2w9QOYEUipUTI8np6LbgGY9Fs98rqVt5AXLIhWkWywlVmtVrB"
        + "p0igcN_IoypGlUPQGe77Rw"

    static func rfcKey() throws -> RSA.PublicKey {
        try RSA.PublicKey(
            modulus: try #require(Base64URL.decode(rfcModulus)), exponent: try #require(Base64URL.decode("AQAB")))
    }

    @Test func rfc7515AppendixA2Verifies() throws {
        let jws = try CompactJWS(Self.rfcToken)
        #expect(jws.algorithm == "RS256")
        #expect(jws.keyID == nil)
        try RS256.verify(jws, publicKey: try Self.rfcKey())
        // No kid in the RFC header: a kid-based lookup must refuse it.
        let error = #expect(throws: JOSEError.self) { try RS256.verify(jws, keys: { _ in try? Self.rfcKey() }) }
        #expect(error?.code == .unknownKey(nil))
    }

    @Test func rfc7515AppendixA2FailsAfterOneFlippedByte() throws {
        let key = try Self.rfcKey()
        let jws = try CompactJWS(Self.rfcToken)
        for index in [0, 128, jws.signatureBytes.count - 1] {
            var signature = jws.signatureBytes
            signature[index] ^= 0x01
            let forged = try CompactJWS(
                String(Self.rfcToken.split(separator: ".")[0...1].joined(separator: ".")) + "." + Base64URL.encode(signature))
            let error = #expect(throws: JOSEError.self) { try RS256.verify(forged, publicKey: key) }
            #expect(error?.code == .badSignature)
        }
        // One flipped bit in the payload ("joe" -> "jne").
        var payload = jws.payloadBytes
        let position = try #require(payload.firstIndex(of: UInt8(ascii: "o")))
        payload[position] ^= 0x01
        let parts = Self.rfcToken.split(separator: ".")
        let tampered = try CompactJWS(parts[0] + "." + Base64URL.encode(payload) + "." + parts[2])
        #expect(throws: JOSEError(.badSignature, reason: "RS256 signature does not verify")) {
            try RS256.verify(tampered, publicKey: key)
        }
    }

    // MARK: Forgeries against a known key set

    static let appleKey = try! RSA.PrivateKey.generate()
    static let attackerKey = try! RSA.PrivateKey.generate()
    static let keys = ["apple-1": appleKey.publicKey]
    static let claims = Array(#"{"iss":"https://appleid.apple.com","aud":"com.example","sub":"001"}"#.utf8)

    static func header(_ json: String) -> [UInt8] { Array(json.utf8) }

    /// Verifies with a lookup that records whether it was consulted.
    static func verifyRecordingLookups(_ token: String) throws -> (error: JOSEError?, lookedUp: Bool) {
        let jws = try CompactJWS(token)
        var lookedUp = false
        do {
            try RS256.verify(jws) { kid in
                lookedUp = true
                return keys[kid]
            }
            return (nil, lookedUp)
        } catch let error as JOSEError {
            return (error, lookedUp)
        }
    }

    @Test func genuineTokenVerifies() throws {
        let token = try JWTSigner.rs256(payload: Self.claims, keyID: "apple-1", privateKey: Self.appleKey)
        #expect(token.hasPrefix(Base64URL.encode(Array(#"{"alg":"RS256","kid":"apple-1"}"#.utf8)) + "."))
        let result = try Self.verifyRecordingLookups(token)
        #expect(result.error == nil)
        try RS256.verify(try CompactJWS(token), keys: Self.keys)
    }

    @Test func algNoneWithEmptySignatureIsRefused() throws {
        let token = JWTSigner.compact(header: Self.header(#"{"alg":"none","kid":"apple-1"}"#), payload: Self.claims) { _ in [] }
        #expect(token.hasSuffix("."))
        let result = try Self.verifyRecordingLookups(token)
        #expect(result.error?.code == .unsupportedAlgorithm("none"))
        #expect(!result.lookedUp)
    }

    @Test func hs256KeyedWithThePublicKeyIsRefused() throws {
        // The classic confusion: HMAC keyed with bytes the attacker knows (the public key).
        for secret in [Array(Self.appleKey.publicKey.pemRepresentation.utf8), Self.appleKey.publicKey.derRepresentation] {
            let token = JWTSigner.compact(header: Self.header(#"{"alg":"HS256","kid":"apple-1"}"#), payload: Self.claims) {
                HMACSHA256.authenticationCode(for: $0, key: secret)
            }
            let result = try Self.verifyRecordingLookups(token)
            #expect(result.error?.code == .unsupportedAlgorithm("HS256"))
            #expect(!result.lookedUp)
        }
    }

    @Test(arguments: [
        (#"{"alg":"RS512","kid":"apple-1"}"#, "RS512" as String?),
        (#"{"alg":"ES256","kid":"apple-1"}"#, "ES256"),
        (#"{"alg":"PS256","kid":"apple-1"}"#, "PS256"),
        (#"{"alg":"rs256","kid":"apple-1"}"#, "rs256"),
        (#"{"alg":"RS256 ","kid":"apple-1"}"#, "RS256 "),
        (#"{"kid":"apple-1"}"#, nil),
    ])
    func otherAlgorithmsAreRefusedBeforeKeyLookup(header: String, algorithm: String?) throws {
        // Signed with the genuine key, so only the alg check can reject it.
        let token = try JWTSigner.compact(header: Self.header(header), payload: Self.claims) {
            try Self.appleKey.rs256Signature(for: $0)
        }
        let result = try Self.verifyRecordingLookups(token)
        #expect(result.error?.code == .unsupportedAlgorithm(algorithm))
        #expect(!result.lookedUp)
    }

    @Test func signatureByAnotherKeyUnderAKnownKidIsRefused() throws {
        let token = try JWTSigner.rs256(payload: Self.claims, keyID: "apple-1", privateKey: Self.attackerKey)
        let result = try Self.verifyRecordingLookups(token)
        #expect(result.error?.code == .badSignature)
    }

    @Test func unknownOrMissingKidIsRefused() throws {
        let unknown = try JWTSigner.rs256(payload: Self.claims, keyID: "attacker-1", privateKey: Self.attackerKey)
        #expect(try Self.verifyRecordingLookups(unknown).error?.code == .unknownKey("attacker-1"))
        let missing = try JWTSigner.rs256(payload: Self.claims, keyID: nil, privateKey: Self.appleKey)
        #expect(try Self.verifyRecordingLookups(missing).error?.code == .unknownKey(nil))
    }

    @Test func tamperedPayloadIsRefused() throws {
        let token = try JWTSigner.rs256(payload: Self.claims, keyID: "apple-1", privateKey: Self.appleKey)
        let parts = token.split(separator: ".")
        let otherClaims = Array(#"{"iss":"https://appleid.apple.com","aud":"com.example","sub":"002"}"#.utf8)
        let tampered = parts[0] + "." + Base64URL.encode(otherClaims) + "." + parts[2]
        #expect(try Self.verifyRecordingLookups(tampered).error?.code == .badSignature)
    }

    @Test func criticalHeaderIsRefused() throws {
        let token = try JWTSigner.compact(
            header: Self.header(#"{"alg":"RS256","crit":["exp"],"exp":1,"kid":"apple-1"}"#), payload: Self.claims
        ) { try Self.appleKey.rs256Signature(for: $0) }
        #expect(try Self.verifyRecordingLookups(token).error?.code == .malformed)
    }

    @Test func encodableClaims() throws {
        struct Claims: Encodable { var iss: String; var url: String }
        let claims = Claims(iss: "https://appleid.apple.com", url: "a/b")
        let token = try JWTSigner.rs256(claims: claims, keyID: "apple-1", privateKey: Self.appleKey)
        let jws = try CompactJWS(token)
        try RS256.verify(jws, keys: Self.keys)
        let decoded = JSONValue.object(jws.payloadBytes)
        #expect(decoded?["iss"]?.stringValue == claims.iss && decoded?["url"]?.stringValue == claims.url)
        #expect(String(decoding: jws.payloadBytes, as: UTF8.self) == #"{"iss":"https://appleid.apple.com","url":"a/b"}"#)
    }
}
