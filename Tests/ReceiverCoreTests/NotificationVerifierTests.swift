import AppleClient
import CryptoCore
import Foundation
import JOSE
import Logging
import ReceiverCore
import Testing
import SiwaModel

/// The decoding path in-process, with a fixed key set (no network, no database): the contract's
/// answers for each shape, and the seed corpus of the fuzz target (deploy/fuzz/corpus) replayed.
@Suite("NotificationVerifier")
struct NotificationVerifierTests {
    static let key = try! RSA.PrivateKey.generate()
    static let now = Date(timeIntervalSince1970: 1_657_617_000)
    static let verifier = NotificationVerifier(
        clientIDs: ["com.example.app", "com.example.app.web"],
        keys: AppleKeySet(http: AppleHTTP(baseURL: URL(string: "http://127.0.0.1:9")!), logger: Logger(label: "t", level: .error)),
        now: { now })

    static func body(_ claims: [String: Any], keyID: String = "k1") throws -> [UInt8] {
        let payload = try JSONSerialization.data(withJSONObject: claims, options: [.sortedKeys])
        return Array(#"{"payload":"\#(try JWTSigner.rs256(payload: Array(payload), keyID: keyID, privateKey: key))"}"#.utf8)
    }

    static func verify(_ body: [UInt8]) -> String {
        switch verifier.verify(body: body, keys: ["k1": key.publicKey]) {
        case .success(let verified): "200 \(verified.notification.event.type)"
        case .failure(let rejection): "\(rejection.status) \(rejection.code)"
        }
    }

    static var claims: [String: Any] { [
        "iss": "https://appleid.apple.com", "aud": "com.example.app", "iat": 1_657_617_063, "exp": 1_657_703_463, "jti": "j1",
        "events": #"{"type":"email-disabled","sub":"s1","email":"a@privaterelay.appleid.com","is_private_email":"true","event_time":1657617063012}"#,
    ] }

    @Test func realShapedNotificationVerifies() throws {
        #expect(Self.verify(try Self.body(Self.claims)) == "200 email-disabled")
    }

    @Test func everyShapeGetsItsContractAnswer() throws {
        var unknownKid = Self.claims
        unknownKid["jti"] = "j2"
        var expired = Self.claims
        expired["exp"] = 1_500_000_000
        var deep = Self.claims
        deep["events"] = String(repeating: "[", count: 5000)
        var huge = Self.claims
        huge["events"] = #"{"type":"consent-revoked","sub":"s","event_time":1e400}"#
        let cases: [([UInt8], String)] = [
            ([], "400 body_not_json"),
            ([0xFF, 0xFE, 0x7B], "400 body_not_json"),
            (Array((String(repeating: "[", count: 100_000)).utf8), "400 body_not_json"),
            (Array(#"{"payload":null}"#.utf8), "400 payload_missing"),
            (Array(#"{"payload":"a.b"}"#.utf8), "400 jws_malformed"),
            (try Self.body(unknownKid, keyID: "nope"), "401 unknown_kid"),
            (try Self.body(expired), "401 expired"),
            (try Self.body(deep), "400 events_malformed"),
            (try Self.body(huge), "400 events_malformed"),
        ]
        for (body, expected) in cases { #expect(Self.verify(body) == expected) }
    }

    /// Signed values the decoder must refuse rather than trap on or skip: an `event_time` of 1e19
    /// (whose milliseconds overflow Int64), an `exp` that is not a number (read as "absent", it
    /// skipped the expiry check), a `crit` header (RFC 7515: refuse what we do not understand).
    @Test func signedButUnusableValuesAre400() throws {
        var farFuture = Self.claims
        farFuture["events"] = #"{"type":"consent-revoked","sub":"s1","event_time":1e19}"#
        var textExp = Self.claims
        textExp["exp"] = "tomorrow"
        var hugeExp = Self.claims
        hugeExp["exp"] = 1e300
        #expect(Self.verify(try Self.body(farFuture)) == "400 events_malformed")
        #expect(Self.verify(try Self.body(textExp)) == "400 claim_malformed")
        #expect(Self.verify(try Self.body(hugeExp)) == "400 claim_malformed")

        let payload = try JSONSerialization.data(withJSONObject: Self.claims, options: [.sortedKeys])
        let critical = try JWTSigner.compact(
            header: Array(#"{"alg":"RS256","crit":["exp"],"exp":1,"kid":"k1"}"#.utf8), payload: Array(payload)
        ) { try Self.key.rs256Signature(for: $0) }
        #expect(Self.verify(Array(#"{"payload":"\#(critical)"}"#.utf8)) == "400 jws_malformed")
    }

    /// The fuzz seeds (signed with the fuzz target's own key, so here mostly 401): none traps.
    @Test func fuzzCorpusReplaysWithoutTrapping() throws {
        let folder = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("deploy/fuzz/corpus")
        let files = try FileManager.default.contentsOfDirectory(atPath: folder.path)
        #expect(files.count >= 40)
        for file in files {
            let outcome = Self.verify(Array(try Data(contentsOf: folder.appendingPathComponent(file))))
            #expect(["200", "400", "401"].contains(outcome.prefix(3)), "\(file): \(outcome)")
        }
    }
}
