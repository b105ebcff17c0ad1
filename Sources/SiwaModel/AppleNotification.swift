package import Foundation
package import JSON

/// A Sign in with Apple server-to-server notification, decoded from the claims of its JWS.
///
/// Apple's documentation and what Apple really sends disagree; this accepts every form seen:
/// `events` as an object or as a string holding one, boolean fields as `"true"`/`"false"` or as
/// booleans, `event_time` in seconds or milliseconds, `account-delete` for `account-deleted`, and
/// `exp` present or absent. Anything else malformed is a `NotificationDecodingError`.
package struct AppleNotification: Sendable, Equatable {
    package var issuer: String
    /// The `aud` claims: one string in practice, an array allowed by JWT.
    package var audiences: [String]
    package var jti: String
    package var issuedAt: Date?
    package var expiresAt: Date?
    package var event: Event

    package struct Event: Sendable, Equatable {
        package var type: EventType
        package var sub: String
        package var time: Date
        package var email: String?
        package var isPrivateEmail: Bool?
    }

    package enum EventType: Sendable, Equatable, CustomStringConvertible {
        case emailDisabled, emailEnabled, consentRevoked, accountDeleted
        /// A verified event of a type we do not know: stored, and recorded as ignored by the worker.
        case unknown(String)

        package init(rawValue: String) {
            switch rawValue {
            case "email-disabled": self = .emailDisabled
            case "email-enabled": self = .emailEnabled
            case "consent-revoked": self = .consentRevoked
            // The older spelling, still in most libraries and in Apple's 2020 session.
            case "account-deleted", "account-delete": self = .accountDeleted
            default: self = .unknown(rawValue)
            }
        }

        /// The spelling stored in `siwa.notifications.event_type`.
        package var rawValue: String {
            switch self {
            case .emailDisabled: "email-disabled"
            case .emailEnabled: "email-enabled"
            case .consentRevoked: "consent-revoked"
            case .accountDeleted: "account-deleted"
            case .unknown(let raw): raw
            }
        }

        package var description: String { rawValue }
    }

    /// `event_time` at or above this is milliseconds (real tokens), below it seconds (the docs).
    /// 10^11 seconds is the year 5138; 10^11 milliseconds is March 1973.
    package static let millisecondsThreshold: Double = 100_000_000_000

    /// Latest time a claim may name: 9999-12-31T23:59:59Z, in seconds. Far past any real event,
    /// and a signed value beyond it must not reach an integer conversion (it would trap) or a
    /// `timestamptz` column (it would be refused as data).
    package static let latestTime: Double = 253_402_300_799

    package static let appleIssuer = "https://appleid.apple.com"
}

/// Why a claims set is not a notification. Each case maps to a 400 with its `code` as the error.
package struct NotificationDecodingError: Error, Equatable, CustomStringConvertible {
    package var code: String
    package var detail: String

    package static func claimsNotJSON() -> Self { .init(code: "claims_not_json", detail: "claims are not a JSON object") }
    package static func missingClaim(_ name: String) -> Self {
        .init(code: "missing_claim", detail: "claim \(name) is missing or not a string")
    }
    package static func claimMalformed(_ name: String) -> Self {
        .init(code: "claim_malformed", detail: "claim \(name) is not a number of seconds in range")
    }
    package static func eventsMissing() -> Self { .init(code: "events_missing", detail: "claim events is missing") }
    package static func eventsMalformed(_ why: String) -> Self { .init(code: "events_malformed", detail: why) }

    package var description: String { "\(code): \(detail)" }
}

extension AppleNotification {
    /// Decodes the JWS payload bytes. Does not judge `iss`, `aud` or `exp`: that is verification's job.
    package init(claims bytes: [UInt8]) throws(NotificationDecodingError) {
        guard let object = JSONValue.object(bytes) else { throw .claimsNotJSON() }
        try self.init(claims: object)
    }

    package init(claims object: [String: JSONValue]) throws(NotificationDecodingError) {
        guard let issuer = object["iss"]?.stringValue else { throw .missingClaim("iss") }
        guard let jti = object["jti"]?.stringValue, !jti.isEmpty else { throw .missingClaim("jti") }
        guard let audiences = Self.audiences(object["aud"]) else { throw .missingClaim("aud") }
        // Present but not a time is malformed, never "absent": an unreadable `exp` must not skip
        // the expiry check.
        let issuedAt = try Self.time(object, "iat")
        let expiresAt = try Self.time(object, "exp")

        let events: [String: JSONValue]
        switch object["events"] {
        case nil, .null?:
            throw .eventsMissing()
        case .object(let eventObject)?:
            events = eventObject
        case .string(let eventString)?:
            // Real tokens carry the event as a JSON string inside the claims.
            guard let nested = JSONValue.object(eventString.utf8) else {  // the String's own bytes, no copy
                throw .eventsMalformed("events string does not hold a JSON object")
            }
            events = nested
        default:
            throw .eventsMalformed("events is neither an object nor a string")
        }

        guard let typeName = events["type"]?.stringValue, !typeName.isEmpty else {
            throw .eventsMalformed("events.type is missing or not a string")
        }
        guard let sub = events["sub"]?.stringValue, !sub.isEmpty else {
            throw .eventsMalformed("events.sub is missing or not a string")
        }
        let time: Date
        if let raw = events["event_time"], raw != .null {
            guard let value = Self.number(raw), value >= 0 else {
                throw .eventsMalformed("events.event_time is not a number")
            }
            let seconds = value >= Self.millisecondsThreshold ? value / 1000 : value
            guard seconds <= Self.latestTime else { throw .eventsMalformed("events.event_time is out of range") }
            time = Date(timeIntervalSince1970: seconds)
        } else if let issuedAt {
            time = issuedAt  // seen in no variant, but a verified event is worth keeping
        } else {
            throw .eventsMalformed("events.event_time is missing")
        }
        var email: String?
        if let raw = events["email"], raw != .null {
            guard let text = raw.stringValue else { throw .eventsMalformed("events.email is not a string") }
            email = text
        }
        var isPrivateEmail: Bool?
        if let raw = events["is_private_email"], raw != .null {
            guard let flag = Self.flag(raw) else {
                throw .eventsMalformed("events.is_private_email is not true or false")
            }
            isPrivateEmail = flag
        }

        self.init(
            issuer: issuer, audiences: audiences, jti: jti, issuedAt: issuedAt, expiresAt: expiresAt,
            event: Event(
                type: EventType(rawValue: typeName), sub: sub, time: time, email: email,
                isPrivateEmail: isPrivateEmail))
    }

    /// The `aud` claim: one string, or a non-empty array of strings only (JWT allows both).
    package static func audiences(_ value: JSONValue?) -> [String]? {
        switch value {
        case .string(let single)?:
            return [single]
        case .array(let many)?:
            let strings = many.compactMap(\.stringValue)
            return !strings.isEmpty && strings.count == many.count ? strings : nil
        default:
            return nil
        }
    }

    /// A NumericDate claim (`iat`, `exp`): nil when absent or null, else seconds within range.
    private static func time(_ object: [String: JSONValue], _ name: String) throws(NotificationDecodingError) -> Date? {
        guard let raw = object[name], raw != .null else { return nil }
        guard let seconds = number(raw), abs(seconds) <= latestTime else { throw .claimMalformed(name) }
        return Date(timeIntervalSince1970: seconds)
    }

    /// A JSON number (never a boolean) or a numeric string.
    package static func number(_ value: JSONValue?) -> Double? {
        switch value {
        case .number(let number)?: number
        case .string(let text)?: Double(text).flatMap { $0.isFinite ? $0 : nil }
        default: nil
        }
    }

    /// `"true"`/`"false"` strings (what Apple sends) or JSON booleans (what the docs show). A
    /// careless `Bool(...)` or truthiness check would turn the string "false" true.
    package static func flag(_ value: JSONValue?) -> Bool? {
        switch value {
        case .string(let text)?:
            switch text.lowercased() {
            case "true": true
            case "false": false
            default: nil
            }
        case .bool(let flag)?: flag
        default: nil
        }
    }
}
