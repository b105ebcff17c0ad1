import AppleClient
import CryptoCore
import Foundation
import HTTPServer
import JOSE
import Logging
import ReceiverCore
import Testing
import Metrics
import SiwaModel

/// The verifier and the handler driven in-process: no network (Apple's keys are preloaded and the
/// key endpoint is a closed port), no database (the store is never started).
@Suite struct ReceiverInProcessTests {
    static let key = try! RSA.PrivateKey.generate()
    static let logger = Logger(label: "test", level: .critical)
    /// Port 9 on loopback: nothing listens, so a refetch fails at once.
    static let keys = AppleKeySet(
        keys: ["k1": key.publicKey], http: AppleHTTP(baseURL: URL(string: "http://127.0.0.1:9")!, timeout: .seconds(2)),
        logger: logger)
    static let now = Date(timeIntervalSince1970: 1_700_000_000)
    let verifier = NotificationVerifier(clientIDs: ["com.example.app"], keys: keys, now: { now })

    static func claims(aud: String = "com.example.app", iss: String = "https://appleid.apple.com", exp: Int? = 1_700_086_400) -> [UInt8] {
        var text = #"{"iss":"\#(iss)","aud":"\#(aud)","iat":1700000000,"jti":"j1","#
        if let exp { text += #""exp":\#(exp),"# }
        text += #""events":"{\"type\":\"consent-revoked\",\"sub\":\"s1\",\"event_time\":1700000000123}"}"#
        return Array(text.utf8)
    }

    static func body(_ claims: [UInt8] = claims(), kid: String = "k1", key: RSA.PrivateKey = key) -> [UInt8] {
        let jws = try! JWTSigner.rs256(payload: claims, keyID: kid, privateKey: key)
        return Array(#"{"payload":"\#(jws)"}"#.utf8)
    }

    func rejection(_ body: [UInt8]) -> Rejection? {
        if case .rejected(let rejection) = verifier.verifyCached(body: body) { return rejection }
        return nil
    }

    @Test func appleShapedBodyVerifies() throws {
        guard case .verified(let verified) = verifier.verifyCached(body: Self.body()) else {
            Issue.record("not verified")
            return
        }
        #expect(verified.clientID == "com.example.app")
        #expect(verified.notification.event.type == .consentRevoked)
        #expect(verified.notification.event.time == Date(timeIntervalSince1970: 1_700_000_000.123))
    }

    @Test func fastPathAndJSONParserAgree() throws {
        let jws = try JWTSigner.rs256(payload: Self.claims(), keyID: "k1", privateKey: Self.key)
        #expect(NotificationVerifier.exactPayload(Array(#"{"payload":"\#(jws)"}"#.utf8)) == jws)
        // Other spellings of the same JSON take the full parser and verify all the same.
        for body in [#"{ "payload" : "\#(jws)" }"#, #"{"other":1,"payload":"\#(jws)"}"#, "{\"payload\":\"\(jws)\"}\n"] {
            #expect(NotificationVerifier.exactPayload(Array(body.utf8)) == nil)
            guard case .verified = verifier.verifyCached(body: Array(body.utf8)) else {
                Issue.record("\(body.prefix(30)) did not verify")
                continue
            }
        }
        // An escaped slash is JSON for "/": not base64url, so the JWS is malformed whatever the path.
        #expect(rejection(Array(#"{"payload":"a\/b.c.d"}"#.utf8)) == .jwsMalformed)
    }

    @Test func claimsAreJudged() {
        #expect(rejection(Self.body(Self.claims(aud: "com.other"))) == .wrongAudience)
        #expect(rejection(Self.body(Self.claims(iss: "https://appleid.apple.com.evil"))) == .wrongIssuer)
        #expect(rejection(Self.body(Self.claims(exp: 1_699_999_000))) == .expired)
        #expect(rejection(Self.body(Self.claims(exp: 1_699_999_990))) == nil, "within the 60 s leeway")
        #expect(rejection(Self.body(Self.claims(exp: nil))) == nil, "exp is optional")
    }

    @Test func forgeriesAreRefusedBeforeAnyKeyIsUsed() throws {
        let payload = Base64URL.encode(Self.claims())
        for alg in ["none", "HS256", "RS512", "ES256", "rs256"] {
            let header = Base64URL.encode(Array(#"{"alg":"\#(alg)","kid":"k1"}"#.utf8))
            let body = Array(#"{"payload":"\#(header).\#(payload).AAAA"}"#.utf8)
            #expect(rejection(body) == .algorithmNotAllowed, "\(alg)")
        }
        #expect(rejection(Self.body(key: try RSA.PrivateKey.generate())) == .badSignature)
    }

    @Test func unknownKidNeedsAFetchAndUnreachableAppleIs503() async {
        guard case .needsKey("k2") = verifier.verifyCached(body: Self.body(kid: "k2")) else {
            Issue.record("expected needsKey")
            return
        }
        let result = await verifier.verify(body: Self.body(kid: "k2"))
        #expect(result.failureValue == .keysUnavailable)
    }

    @Test func handlerMapsEveryAnswerInOnePlace() async {
        let store = NotificationStore(conninfo: "host=127.0.0.1 port=9", logger: Self.logger)
        let handler = ReceiverHandler(
            notificationPath: "/apple/notifications", verifier: verifier, store: store, keys: Self.keys,
            metrics: MetricsRegistry(), logger: Self.logger)
        func send(_ method: String, _ path: String, _ body: [UInt8] = []) async -> HTTPResponse {
            await withCheckedContinuation { continuation in
                handler.handle(HTTPRequest(method: method, path: path, query: [:], headers: [:], body: body, remoteAddress: nil)) {
                    continuation.resume(returning: $0)
                }
            }
        }
        let notJSON = await send("POST", "/apple/notifications", Array("x".utf8))
        #expect(notJSON.status == 400 && String(decoding: notJSON.body, as: UTF8.self) == #"{"error":"body_not_json"}"#)
        // Every notification answer carries a request id, the same one the log lines carry.
        let again = await send("POST", "/apple/notifications", Array("x".utf8))
        #expect(notJSON.header("X-Request-Id") != nil && notJSON.header("X-Request-Id") != again.header("X-Request-Id"))
        #expect(await send("GET", "/apple/notifications").status == 405)
        #expect(await send("GET", "/apple/notifications").header("Allow") == "POST")
        #expect(await send("POST", "/other").status == 404)
        #expect(await send("GET", "/healthz").status == 200)
        #expect(await send("GET", "/readyz").status == 503, "no database yet")
        // Verified but the store is not running: refused with 503, never a 200 that was not committed.
        let stored = await send("POST", "/apple/notifications", Self.body())
        #expect(stored.status == 503)
        let metrics = String(decoding: await send("GET", "/metrics").body, as: UTF8.self)
        #expect(metrics.contains(#"siwa_receiver_requests_total{reason="body_not_json",status="400"} 2"#))
    }
}

extension Result {
    fileprivate var failureValue: Failure? {
        if case .failure(let failure) = self { return failure }
        return nil
    }
}
