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

    static let privateKeyPEM = """
-----BEGIN PRIVATE KEY-----
MIIEvgIBADANBgkqhkiG9w0BAQEFAASCBKgwggSkAgEAAoIBAQC80sphM8ERu4h5
jC2Uchp4KeBjgsB71ZDHNjDYcyVr1ZwAulxioStAeSpY+z4H9bzLlu/KGWqcwqII
ZC5C9Kcp8YbBCWC9MzstVPO+UsY0W9gMIvjYvGQNqi9inxYIMx3BlcLJfzRZDr99
EM7tBvJfA+lVBM4B+EVWvF831LqcVQGEljpo9xJD9ai1YSgGi7x/TltAPNihw22v
c/hhwvDZmwtzTHVM/El12wbEd0+SkWw1l5/uJeopb2VyaSLP25Am0MdWZkHTFOqN
aBxjllPWtyJop075Wxx60RKtSijQ5FlWT6IZ8/kGKqYDny0E/xIBR9IReEZw7ups
jc8hMBM3AgMBAAECggEAXHrZCBZy/x5cTzuqr0PbVvMbpWFKqNwGlqsh7UEoGNJ8
H5cm3F+XcXJmnUIgNYHTv9rjApbEMpbZCUcXqU9t+AsFNtJDASdwWll7L8IWtVou
THNscaqDTnYF00WbYtS2RDP3PP0CRIQGoVh0IH8AgizGQQ+jXi+ctkh4Uj3sT9gz
EhX9528NdJpgkKaeMF6TIC/fLUrqVPWwQkvfjpkO5mvOkAqboQZaa+UWBO8GCDEq
przttLer/S/Wsp3k3s+9CnChKzhHhMkwCAEwzBv/+q0szOgvFOjsoqJJiP1pX0xO
jFYol4n8ErMdQjqv5MD/gCxtsOdebxu/iGrNeBF+oQKBgQDcywUDgbb117YDh6Lt
PZJdAVvFDvsH5JKIw0S7gVJgWucNqpvJUyn0/bq8mQTNT3GpwHq7Mpi0QflmQwo9
KP6iQMkIir6Z1N7yTrycIXqTGA+gtsUZTmP1DhrQPnuhYPWP8Qi3TEh+429rCa+f
9ORaQmqQNCfk66oNE6AxBE1LTwKBgQDa7r1qSVu7OCM2AcW0Oq8LcHX/UTDIVXHO
QZHpq/iyD3As107YlAWBcxLT4Dae2ljr+qSunPpsJav59yNfGSXsRSZLfGHQ8nL+
BotF9l2xurSG5O93EyRxZMbhFreKYe4iSUbxExnAH7UGlP9PTfSwLOVYeP0fCEpQ
l9Y78UifmQKBgEM27tTNdVRMEdXrQbc1SkxT8IsB73vMoqtNvqvSR7Cbm8E2Ueyt
C5XQdDub3bFe4PxLY1F/qqsddn4iJIjP5Qyh6lFWY4XTHvfm7lYdfwIujftgCIqW
qaldXN5OVzaenMLwHrYmW998/1s3fKaWV7n+hBBYQFjZQVBvzBF//MPTAoGBALXv
fB0dhUuaJTi2VFOoCNtaw9Q+5mk1CHQ87ULglLV0OuYoru8wYzrmJBlK1FlCXm8M
RVqOPVUuITKC/DQFNAyakm5cmPUI5iLP0WF8kPQnkeofyhiMIdbRxqw7Mp+fLkPz
3S5tjxKnxsoHe/utbtARHy5crQzi2M8Mvw3lP1LRAoGBAKhg3HNjXnyu0y0TBxXX
bmfk92IloOloxbcgWmikev3lTXHMziT1JWDKQ1pUCTQoIwdarE9Ua+RAyw4TJCdp
cOQnPp2hLM3UJ3XNV5ZzAD435USKoWP+y+T6Y7KpXNCX/tdeXwS8GbdKeVYhaQ1M
u5pUSLjCbV2t/LtZfnDoAoVT
-----END PRIVATE KEY-----
"""

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
