import AppleClient
import CryptoCore
import Foundation
import JOSE
import Testing

@Suite struct ClientSecretSignerTests {
    @Test func secretHasAppleShapeAndVerifies() throws {
        let key = try P256.Signing.PrivateKey.generate()
        let signer = ClientSecretSigner(teamID: "TEAM123456", keyID: "KEY987", privateKey: key)
        let now = Date(timeIntervalSince1970: 1_700_000_000)
        let secret = try signer.makeSecret(clientID: "com.example.app", now: now)
        let jws = try CompactJWS(secret)
        #expect(jws.algorithm == "ES256")
        #expect(jws.keyID == "KEY987")
        #expect(jws.signatureBytes.count == 64)  // raw R‖S, not DER
        try ES256.verify(jws, publicKey: key.publicKey)
        let claims = try #require(try JSONSerialization.jsonObject(with: Data(jws.payloadBytes)) as? [String: Any])
        #expect(claims["iss"] as? String == "TEAM123456")
        #expect(claims["aud"] as? String == "https://appleid.apple.com")
        #expect(claims["sub"] as? String == "com.example.app")
        let iat = try #require(claims["iat"] as? Int)
        let exp = try #require(claims["exp"] as? Int)
        #expect(iat == 1_700_000_000)
        #expect(exp > iat && exp - iat <= 300)
    }

    @Test func lifetimeIsCappedAtFiveMinutes() throws {
        let signer = ClientSecretSigner(teamID: "T", keyID: "K", privateKey: try .generate(), lifetime: 86_400)
        let jws = try CompactJWS(try signer.makeSecret(clientID: "c"))
        let claims = try #require(try JSONSerialization.jsonObject(with: Data(jws.payloadBytes)) as? [String: Any])
        #expect((claims["exp"] as? Int ?? 0) - (claims["iat"] as? Int ?? 0) == 300)
    }

    @Test func everyCallMintsAFreshSecret() throws {
        let signer = ClientSecretSigner(teamID: "T", keyID: "K", privateKey: try .generate())
        // ECDSA signatures are randomized: two secrets for the same second still differ.
        #expect(try signer.makeSecret(clientID: "c") != signer.makeSecret(clientID: "c"))
    }

    @Test func loadsAP8File() throws {
        let key = try P256.Signing.PrivateKey.generate()
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("AuthKey_\(UUID().uuidString).p8").path
        try key.pemRepresentation.write(toFile: path, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: path) }
        let signer = try ClientSecretSigner(teamID: "T", keyID: "K", privateKeyFile: path)
        try ES256.verify(try CompactJWS(try signer.makeSecret(clientID: "c")), publicKey: key.publicKey)
        #expect(throws: AppleClientError.self) { try ClientSecretSigner(teamID: "T", keyID: "K", privateKeyFile: path + ".missing") }
    }
}

@Suite struct RetryAfterTests {
    let now = Date(timeIntervalSince1970: 1_445_412_480)  // Wed, 21 Oct 2015 07:28:00 GMT

    @Test func seconds() {
        #expect(RetryAfter.parse("120", now: now) == .seconds(120))
        #expect(RetryAfter.parse(" 0 ", now: now) == .seconds(0))
        #expect(RetryAfter.parse("99999999", now: now) == RetryAfter.maximum)
    }

    @Test func httpDate() {
        #expect(RetryAfter.parse("Wed, 21 Oct 2015 07:28:30 GMT", now: now) == .seconds(30))
        #expect(RetryAfter.parse("Wed, 21 Oct 2015 07:27:00 GMT", now: now) == .seconds(0))  // past: now
    }

    @Test func garbageIsIgnored() {
        #expect(RetryAfter.parse(nil, now: now) == nil)
        #expect(RetryAfter.parse("", now: now) == nil)
        #expect(RetryAfter.parse("soon", now: now) == nil)
        #expect(RetryAfter.parse("-5", now: now) == nil)
    }
}

@Suite struct ClassificationTests {
    func classify(_ status: Int, _ body: String = "", headers: [String: String] = [:]) -> AppleCallOutcome<Bool> {
        AppleAuthClient.classify(AppleHTTPResponse(status: status, body: Array(body.utf8), headers: headers)) { _ in true }
    }

    @Test func outcomes() {
        #expect(classify(200) == .success(true))
        #expect(classify(503) == .retryable(reason: "http_503"))
        #expect(classify(500) == .retryable(reason: "http_500"))
        #expect(classify(429, headers: ["retry-after": "2"]) == .rateLimited(retryAfter: .seconds(2)))
        #expect(classify(429) == .rateLimited(retryAfter: nil))
        #expect(classify(400, #"{"error":"invalid_client"}"#) == .configurationFault(error: "invalid_client"))
        #expect(classify(400, #"{"error":"unauthorized_client"}"#) == .configurationFault(error: "unauthorized_client"))
        #expect(classify(400, #"{"error":"invalid_grant"}"#) == .invalidGrant)
        #expect(classify(400, #"{"error":"invalid_request"}"#) == .otherClientError(status: 400, code: "invalid_request"))
        #expect(classify(404, "nope") == .otherClientError(status: 404, code: nil))
    }

    @Test func transportErrorsAreRetryable() {
        let outcome: AppleCallOutcome<Bool> = AppleAuthClient.classify(
            transportError: AppleTransportError(kind: .timeout, endpoint: "auth/revoke", detail: ""))
        #expect(outcome == .retryable(reason: "timeout"))
    }
}

@Suite struct FormEncodingTests {
    @Test func roundTripsReservedCharacters() {
        let fields = [("client_id", "com.example.app"), ("code", "a+b/c=d&e f~"), ("token", "ü€")]
        let encoded = FormEncoding.encode(fields)
        #expect(encoded == "client_id=com.example.app&code=a%2Bb%2Fc%3Dd%26e%20f~&token=%C3%BC%E2%82%AC")
        let decoded = FormEncoding.decode(encoded)
        #expect(decoded["code"] == "a+b/c=d&e f~")
        #expect(decoded["token"] == "ü€")
        #expect(FormEncoding.decode("a=1+2&b")["a"] == "1 2")
    }
}
