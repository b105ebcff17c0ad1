import CryptoCore
import Foundation
import JOSE

enum FuzzFiles {
    /// `path` itself, or the regular files directly inside it, sorted.
    static func list(_ path: String) -> [String] {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else { return [] }
        guard isDirectory.boolValue else { return [path] }
        let names = (try? FileManager.default.contentsOfDirectory(atPath: path)) ?? []
        return names.sorted().map { path + "/" + $0 }
    }
}

/// The seed corpus: real-shaped notifications signed with the fuzz key, and every malformed
/// shape the unit and process tests use (so the fuzzer starts from each rejection branch).
enum FuzzCorpus {
    static func write(claimsFile: String, to directory: String) throws -> Int {
        let fixture = try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: claimsFile))) as? [String: Any] ?? [:]
        let variants = fixture["variants"] as? [String: [String: Any]] ?? [:]
        var seeds: [(String, [UInt8])] = []
        for (name, claims) in variants.sorted(by: { $0.key < $1.key }) {
            let payload = try JSONSerialization.data(withJSONObject: claims, options: [.sortedKeys])
            seeds.append(("valid-\(name)", body(try sign(Array(payload)))))
        }
        if let malformed = fixture["malformed_body_from_apples_docs"] as? String {
            seeds.append(("claims-docs-malformed", body(try sign(Array(malformed.utf8)))))
        }
        let base: [String: Any] = [
            "iss": "https://appleid.apple.com", "aud": "com.example.app", "iat": 1_657_617_063, "exp": 1_657_703_463,
            "jti": "seed-jti",
        ]
        let eventVariants: [(String, Any?)] = [
            ("events-missing", nil),
            ("events-number", 42),
            ("events-string-not-json", "{not json"),
            ("events-array", [["type": "consent-revoked"]]),
            ("event-no-sub", #"{"type":"consent-revoked","event_time":1657617063012}"#),
            ("event-no-type", #"{"sub":"s","event_time":1657617063012}"#),
            ("event-time-string", #"{"type":"consent-revoked","sub":"s","event_time":"soon"}"#),
            ("event-time-huge", #"{"type":"consent-revoked","sub":"s","event_time":1e400}"#),
            ("event-time-negative", #"{"type":"consent-revoked","sub":"s","event_time":-99999999999999999999}"#),
            ("private-email-maybe", #"{"type":"email-enabled","sub":"s","email":"a@b","is_private_email":"maybe","event_time":1}"#),
            ("unknown-type", #"{"type":"account-renamed","sub":"s","event_time":1657617063012}"#),
            ("nested-deep", String(repeating: "[", count: 600) + String(repeating: "]", count: 600)),
        ]
        for (name, events) in eventVariants {
            var claims = base
            claims["events"] = events
            let payload = try JSONSerialization.data(withJSONObject: claims, options: [.sortedKeys])
            seeds.append(("claims-\(name)", body(try sign(Array(payload)))))
        }
        for (name, change) in [("wrong-iss", ("iss", "https://evil.example")), ("wrong-aud", ("aud", "com.other.app")),
                               ("expired", ("exp", "1500000000"))] as [(String, (String, String))] {
            var claims = base
            claims["events"] = #"{"type":"consent-revoked","sub":"s","event_time":1657617063012}"#
            claims[change.0] = Int(change.1) ?? change.1 as Any
            let payload = try JSONSerialization.data(withJSONObject: claims, options: [.sortedKeys])
            seeds.append(("claims-\(name)", body(try sign(Array(payload)))))
        }
        var aud = base
        aud["aud"] = ["com.other.app", "com.example.app.web"]
        aud["events"] = ["type": "email-disabled", "sub": "s", "event_time": 1_657_617_063, "is_private_email": true]
        seeds.append(("claims-aud-array", body(try sign(Array(try JSONSerialization.data(withJSONObject: aud, options: [.sortedKeys]))))))

        // Structure and header rejections.
        let claims = Array(try JSONSerialization.data(withJSONObject: base.merging(["events": "{}"]) { a, _ in a }))
        let payload64 = Base64URL.encode(claims)
        let valid = try sign(claims)
        let parts = valid.split(separator: ".").map(String.init)
        seeds += [
            ("body-empty", []), ("body-not-json", Array("hello".utf8)), ("body-array", Array("[1,2]".utf8)),
            ("body-no-payload", Array(#"{"token":"x"}"#.utf8)), ("body-payload-number", Array(#"{"payload":42}"#.utf8)),
            ("jws-two-parts", Array(#"{"payload":"abc.def"}"#.utf8)),
            ("jws-four-parts", body(valid + ".x")),
            ("jws-bad-base64", body("!!!.\(payload64).AAAA")),
            ("jws-swapped", body("\(parts[1]).\(parts[0]).\(parts[2])")),
            ("alg-none", body(Base64URL.encode(Array(#"{"alg":"none","kid":"fuzz-1"}"#.utf8)) + ".\(payload64).")),
            ("alg-hs256", body(Base64URL.encode(Array(#"{"alg":"HS256","kid":"fuzz-1"}"#.utf8)) + ".\(payload64).AAAA")),
            ("kid-missing", body(Base64URL.encode(Array(#"{"alg":"RS256"}"#.utf8)) + ".\(payload64).\(parts[2])")),
            ("kid-unknown", body(try sign(claims, keyID: "other-kid"))),
            ("header-not-json", body(Base64URL.encode(Array("{".utf8)) + ".\(payload64).\(parts[2])")),
            ("signature-truncated", body("\(parts[0]).\(parts[1]).\(parts[2].prefix(10))")),
            ("signature-other-key", body(try JWTSigner.rs256(payload: claims, keyID: "fuzz-1", privateKey: try RSA.PrivateKey.generate()))),
            ("body-non-utf8", [0x7B, 0x22, 0x70, 0x61, 0x79, 0x6C, 0x6F, 0x61, 0x64, 0x22, 0x3A, 0x22, 0xFF, 0xFE, 0x22, 0x7D]),
            ("body-deep", Array((String(repeating: #"{"a":"#, count: 1000) + "1" + String(repeating: "}", count: 1000)).utf8)),
            ("body-huge-number", Array(#"{"payload":"x","n":1e999999}"#.utf8)),
        ]
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        for (name, bytes) in seeds {
            try Data(bytes).write(to: URL(fileURLWithPath: directory).appendingPathComponent("seed-\(name)"))
        }
        return seeds.count
    }

    static func sign(_ payload: [UInt8], keyID: String = FuzzFixture.keyID) throws -> String {
        try JWTSigner.rs256(payload: payload, keyID: keyID, privateKey: FuzzFixture.privateKey)
    }

    static func body(_ jws: String) -> [UInt8] { Array(#"{"payload":"\#(jws)"}"#.utf8) }
}
