internal import CryptoCore
internal import Foundation

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
}
