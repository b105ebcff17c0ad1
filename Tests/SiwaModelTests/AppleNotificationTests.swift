import Foundation
import Testing
import SiwaModel

/// Apple's claim sets in every variant seen (Tests/Fixtures/notification-claims.json).
enum ClaimFixtures {
    static let url = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/notification-claims.json")

    /// Parsed on each use: `[String: Any]` is not Sendable, and the file is small.
    static var document: [String: Any] {
        let data = try! Data(contentsOf: url)
        return try! JSONSerialization.jsonObject(with: data) as! [String: Any]
    }

    static func variant(_ name: String) -> [UInt8] {
        let variants = document["variants"] as! [String: Any]
        return Array(try! JSONSerialization.data(withJSONObject: variants[name]!))
    }
}

@Suite struct AppleNotificationDecodingTests {
    @Test func docsObjectWithSecondsDecodes() throws {
        let notification = try AppleNotification(claims: ClaimFixtures.variant("docs_consent_revoked_object_seconds"))
        #expect(notification.event.type == .consentRevoked)
        #expect(notification.event.sub == "820417.faa325acbc78e1be1668ba852d492d8a.0219")
        #expect(notification.event.time == Date(timeIntervalSince1970: 1_508_184_845))
        #expect(notification.event.email == nil)
        #expect(notification.expiresAt == nil)
        #expect(notification.audiences == ["com.example.app"])
    }

    @Test func realStringEventsWithMillisecondsDecode() throws {
        let notification = try AppleNotification(
            claims: ClaimFixtures.variant("real_email_disabled_string_milliseconds"))
        #expect(notification.event.type == .emailDisabled)
        #expect(notification.event.time == Date(timeIntervalSince1970: 1_657_617_063.012))
        #expect(notification.event.isPrivateEmail == true)
        #expect(notification.event.email == "abc123xyz@privaterelay.appleid.com")
        #expect(notification.expiresAt == Date(timeIntervalSince1970: 1_657_703_463))
    }

    @Test func olderAccountDeleteSpellingIsNormalised() throws {
        let notification = try AppleNotification(claims: ClaimFixtures.variant("older_spelling_account_delete"))
        #expect(notification.event.type == .accountDeleted)
        #expect(notification.event.type.rawValue == "account-deleted")
    }

    @Test func booleanFalseStaysFalse() throws {
        let notification = try AppleNotification(claims: ClaimFixtures.variant("boolean_private_email_false"))
        #expect(notification.event.isPrivateEmail == false)
    }

    @Test(arguments: [("\"false\"", false), ("\"true\"", true), ("false", false), ("true", true), ("\"FALSE\"", false)])
    func privateEmailFlagForms(raw: String, expected: Bool) throws {
        let claims = claimsJSON(events: #"{"type":"email-enabled","sub":"s","event_time":1,"is_private_email":\#(raw)}"#)
        #expect(try AppleNotification(claims: claims).event.isPrivateEmail == expected)
    }

    @Test func everyFixtureVariantDecodes() throws {
        let variants = ClaimFixtures.document["variants"] as! [String: Any]
        #expect(variants.count >= 6)
        for name in variants.keys {
            #expect(throws: Never.self, "variant \(name)") { try AppleNotification(claims: ClaimFixtures.variant(name)) }
        }
    }

    @Test func docsExampleWithMissingCommaIsMalformed() {
        let body = ClaimFixtures.document["malformed_body_from_apples_docs"] as! String
        #expect(throws: NotificationDecodingError.claimsNotJSON()) { try AppleNotification(claims: Array(body.utf8)) }
    }

    @Test func unknownTypeIsKeptVerbatim() throws {
        let claims = claimsJSON(events: #"{"type":"something-new","sub":"s","event_time":5}"#)
        #expect(try AppleNotification(claims: claims).event.type == .unknown("something-new"))
    }

    @Test func thresholdSeparatesSecondsFromMilliseconds() throws {
        let seconds = claimsJSON(events: #"{"type":"consent-revoked","sub":"s","event_time":99999999999}"#)
        let millis = claimsJSON(events: #"{"type":"consent-revoked","sub":"s","event_time":100000000000}"#)
        #expect(try AppleNotification(claims: seconds).event.time.timeIntervalSince1970 == 99_999_999_999)
        #expect(try AppleNotification(claims: millis).event.time.timeIntervalSince1970 == 100_000_000)
    }

    @Test(arguments: [
        (#"{"iss":"https://appleid.apple.com","aud":"a","jti":"j"}"#, "events_missing"),
        (#"{"iss":"https://appleid.apple.com","aud":"a","jti":"j","events":42}"#, "events_malformed"),
        (#"{"iss":"https://appleid.apple.com","aud":"a","jti":"j","events":"{not json"}"#, "events_malformed"),
        (#"{"iss":"https://appleid.apple.com","aud":"a","jti":"j","events":{"sub":"s","event_time":1}}"#, "events_malformed"),
        (#"{"iss":"https://appleid.apple.com","aud":"a","jti":"j","events":{"type":"consent-revoked","event_time":1}}"#, "events_malformed"),
        (#"{"iss":"https://appleid.apple.com","aud":"a","jti":"j","events":{"type":"consent-revoked","sub":"s","event_time":"soon"}}"#, "events_malformed"),
        (#"{"iss":"https://appleid.apple.com","aud":"a","jti":"j","events":{"type":"email-enabled","sub":"s","event_time":1,"is_private_email":"yes"}}"#, "events_malformed"),
        (#"{"iss":"https://appleid.apple.com","aud":"a","events":{"type":"consent-revoked","sub":"s","event_time":1}}"#, "missing_claim"),
        (#"{"iss":"https://appleid.apple.com","jti":"j","events":{"type":"consent-revoked","sub":"s","event_time":1}}"#, "missing_claim"),
        (#"["not","an","object"]"#, "claims_not_json"),
        ("", "claims_not_json"),
    ])
    func malformedClaimsAreRejectedWithACode(json: String, code: String) {
        do {
            _ = try AppleNotification(claims: Array(json.utf8))
            Issue.record("decoded \(json)")
        } catch {
            #expect(error.code == code)
        }
    }

    private func claimsJSON(events: String) -> [UInt8] {
        Array(#"{"iss":"https://appleid.apple.com","aud":"com.example.app","iat":1,"jti":"j1","events":\#(events)}"#.utf8)
    }
}
