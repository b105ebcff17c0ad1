import AppleClient
import CryptoCore
import Foundation
import Logging
import ReceiverCore

/// What every fuzz input runs against: one fixed RSA key (kid `fuzz-1`), the fixture's client IDs,
/// and a fixed clock inside the captured tokens' validity, so real-shaped seeds verify and the
/// whole path (signature, claims, events) is reachable. TEST ONLY key: it signs the seed corpus.
enum FuzzFixture {
    static let keyID = "fuzz-1"
    static let clientIDs = ["com.example.app", "com.example.app.web"]
    /// 2022-07-12T09:10:00Z: after the captured tokens' iat, before their exp.
    static let now = Date(timeIntervalSince1970: 1_657_617_000)

    /// TEST ONLY key, kept in Fixtures/ beside this file (the seed corpus is signed with it).
    static let privateKeyPEM: String = {
        let path = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
            .appendingPathComponent("Fixtures/fuzz-key.pem").path
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else {
            fatalError("fuzz key missing at \(path)")
        }
        return text
    }()

    static let privateKey: RSA.PrivateKey = {
        do { return try RSA.PrivateKey(pemRepresentation: privateKeyPEM) } catch { fatalError("fuzz key: \(error)") }
    }()

    static let keys: [String: RSA.PublicKey] = [keyID: privateKey.publicKey]

    static let verifier = NotificationVerifier(
        clientIDs: clientIDs,
        keys: AppleKeySet(
            http: AppleHTTP(baseURL: URL(string: "http://127.0.0.1:9")!, timeout: .seconds(1)),
            logger: Logger(label: "fuzz", level: .error)),
        now: { FuzzFixture.now })

    /// One input through the whole decoding path. Never throws, never traps: any trap is a finding.
    static func run(_ body: [UInt8]) -> String {
        switch verifier.verify(body: body, keys: keys) {
        case .success: "200"
        case .failure(let rejection): "\(rejection.status) \(rejection.code)"
        }
    }
}
