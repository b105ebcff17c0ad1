package import CryptoCore
package import Foundation
import JOSE

/// A server-to-server notification shaped like the ones Apple really sends (`events` as a JSON
/// string, `event_time` in milliseconds, booleans as strings, `exp` = `iat` + 24 h), signed RS256.
package struct FakeNotification: Sendable {
    package static let types = ["consent-revoked", "account-deleted", "email-enabled", "email-disabled"]

    package var type: String
    package var sub: String
    package var clientID: String
    package var email: String?
    package var isPrivateEmail: Bool?
    /// Milliseconds since 1970.
    package var eventTime: Int64
    package var jti: String

    package init(
        type: String, sub: String, clientID: String, email: String? = nil, isPrivateEmail: Bool? = nil,
        eventTime: Int64? = nil, jti: String? = nil
    ) {
        self.type = type
        self.sub = sub
        self.clientID = clientID
        self.email = email
        self.isPrivateEmail = isPrivateEmail
        self.eventTime = eventTime ?? Int64(Date().timeIntervalSince1970 * 1000)
        self.jti = jti ?? UUID().uuidString.lowercased()
    }

    package func claimsJSON(now: Date = Date()) -> [UInt8] {
        var event: [String: Any] = ["type": type, "sub": sub, "event_time": eventTime]
        if type.hasPrefix("email-") {
            if let email { event["email"] = email }
            if let isPrivateEmail { event["is_private_email"] = isPrivateEmail ? "true" : "false" }
        }
        let events = (try? JSONSerialization.data(withJSONObject: event, options: [.sortedKeys, .withoutEscapingSlashes])) ?? Data()
        let iat = Int(now.timeIntervalSince1970)
        let claims: [String: Any] = [
            "iss": FakeApple.issuer, "aud": clientID, "iat": iat, "exp": iat + 86_400, "jti": jti,
            "events": String(decoding: events, as: UTF8.self),
        ]
        let data = (try? JSONSerialization.data(withJSONObject: claims, options: [.sortedKeys, .withoutEscapingSlashes])) ?? Data()
        return Array(data)
    }

    package func signed(keyID: String, privateKey: RSA.PrivateKey) throws -> String {
        try JWTSigner.rs256(payload: claimsJSON(), keyID: keyID, privateKey: privateKey)
    }
}
