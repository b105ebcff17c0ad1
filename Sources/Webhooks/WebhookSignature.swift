internal import CryptoCore
package import Foundation

/// Standard Webhooks' symmetric signature: `v1,` + base64 of HMAC-SHA256 over
/// `{webhook-id}.{webhook-timestamp}.{body}`, keyed with the secret's decoded bytes.
package enum WebhookSignature {
    package static func sign(id: String, timestamp: Int64, body: [UInt8], secret: WebhookSecret) -> String {
        var message = Array("\(id).\(timestamp).".utf8)
        message.append(contentsOf: body)
        let code = HMACSHA256.authenticationCode(for: message, key: secret.key)
        return "v1," + Data(code).base64EncodedString()
    }

    /// The three headers of one attempt, in the order they are sent.
    package static func headers(id: String, timestamp: Int64, body: [UInt8], secret: WebhookSecret) -> [(String, String)] {
        [
            ("webhook-id", id), ("webhook-timestamp", String(timestamp)),
            ("webhook-signature", sign(id: id, timestamp: timestamp, body: body, secret: secret)),
        ]
    }

    /// A receiver's check (for `siwa webhooks sink`): any `v1,` signature of the space-separated
    /// header matches (constant-time), and the timestamp is within `tolerance` of `now`.
    package static func isValid(
        id: String, timestamp: String, body: [UInt8], signatures: String, secret: WebhookSecret, now: Date = Date(),
        tolerance: TimeInterval = 300
    ) -> Bool {
        guard let seconds = Int64(timestamp), abs(now.timeIntervalSince1970 - Double(seconds)) <= tolerance else { return false }
        var message = Array("\(id).\(timestamp).".utf8)
        message.append(contentsOf: body)
        return signatures.split(separator: " ").contains { candidate in
            guard candidate.hasPrefix("v1,"), let code = Data(base64Encoded: String(candidate.dropFirst(3))) else { return false }
            return HMACSHA256.isValidAuthenticationCode(Array(code), for: message, key: secret.key)
        }
    }
}
