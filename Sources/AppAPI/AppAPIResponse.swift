import Accounts
import Foundation
internal import HTTPServer
import JOSE
import Postgres
import SiwaModel

/// An answer other than success: the contract's status and `{"error":"<code>"}`, with a `detail`
/// naming the field or rule that failed when there is one. A detail never quotes a value sent.
struct AppAPIError: Error, Sendable, Equatable {
    var status: Int
    var code: String
    var detail: String?

    static let unauthorized = AppAPIError(status: 401, code: "unauthorized")
    static let badRequest = AppAPIError(status: 400, code: "bad_request")
    static let notFound = AppAPIError(status: 404, code: "not_found")
    static let methodNotAllowed = AppAPIError(status: 405, code: "method_not_allowed")
    static let nonceInvalid = AppAPIError(status: 401, code: "nonce_invalid")
    static let tokenInvalid = AppAPIError(status: 401, code: "token_invalid")
    /// A web sign-in's ticket unknown, expired or already spent (`POST /v1/sign-in {"ticket"}`).
    static let ticketInvalid = AppAPIError(status: 401, code: "ticket_invalid")
    static let accountDeleting = AppAPIError(status: 403, code: "account_deleting")
    static let accountNotFound = AppAPIError(status: 404, code: "account_not_found")
    static let codeInvalid = AppAPIError(status: 400, code: "code_invalid")
    static let tokenExchangeFailed = AppAPIError(status: 502, code: "token_exchange_failed")
    /// Apple's keys could not be fetched and none is cached for the token's `kid` (the receiver's 503).
    static let keysUnavailable = AppAPIError(status: 503, code: "keys_unavailable")
    /// `SIWA_NONCE_MAX_UNSPENT` unspent nonces are kept already (sent with `Retry-After`).
    static let tooManyNonces = AppAPIError(status: 429, code: "too_many_nonces")
    /// The database did not answer within its bound, or failed.
    static let databaseUnavailable = AppAPIError(status: 503, code: "database_unavailable")

    /// 400 `bad_request` saying which field or rule failed.
    static func badRequest(_ detail: String) -> AppAPIError { AppAPIError(status: 400, code: "bad_request", detail: detail) }

    /// The same error with a detail (the code and status unchanged).
    func detailed(_ detail: String) -> AppAPIError { AppAPIError(status: status, code: code, detail: detail) }

    var response: HTTPResponse {
        var body: [String: Any] = ["error": code]
        if let detail { body["detail"] = detail }
        return AppAPIJSON.response(status: status, body)
    }

    /// What a database failure answers: SQLSTATE class 22 (data exception: a NUL in text, a number
    /// out of range, a malformed value) and 23 (a constraint) mean the input cannot be held, which
    /// no retry changes; anything else is the database being unavailable.
    static func database(_ error: any Error) -> AppAPIError {
        if let error = error as? PostgresError, let state = error.sqlState, state.hasPrefix("22") || state.hasPrefix("23") {
            return .badRequest("a value cannot be stored (SQLSTATE \(state))")
        }
        return .databaseUnavailable
    }
}

/// JSON bodies of the app API's answers.
enum AppAPIJSON {
    /// RFC 3339 in UTC with milliseconds (truncated), `2026-12-02T13:50:00.123Z`. Written by hand:
    /// `ISO8601FormatStyle` costs more than the rest of a nonce's answer, and it lands a millisecond
    /// short on some exact values (`.100` written `.099`).
    static func timestamp(_ date: Date) -> String {
        // To the microsecond first (PostgreSQL's precision, which a Double holds only to within a
        // fraction of one), then truncated to the millisecond.
        let micros = Int64((date.timeIntervalSince1970 * 1_000_000).rounded())
        let millis = micros >= 0 ? micros / 1000 : (micros - 999) / 1000
        var seconds = time_t(millis >= 0 ? millis / 1000 : (millis - 999) / 1000)
        let milliseconds = Int(millis - Int64(seconds) * 1000)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        var text: [UInt8] = []
        text.reserveCapacity(24)
        func digits(_ value: Int, _ count: Int) {
            var divisor = 1
            for _ in 1..<count { divisor *= 10 }
            var rest = value
            while divisor > 0 {
                text.append(UInt8(ascii: "0") + UInt8(rest / divisor % 10))
                rest %= divisor
                divisor /= 10
            }
        }
        digits(Int(parts.tm_year) + 1900, 4)
        text.append(UInt8(ascii: "-")); digits(Int(parts.tm_mon) + 1, 2)
        text.append(UInt8(ascii: "-")); digits(Int(parts.tm_mday), 2)
        text.append(UInt8(ascii: "T")); digits(Int(parts.tm_hour), 2)
        text.append(UInt8(ascii: ":")); digits(Int(parts.tm_min), 2)
        text.append(UInt8(ascii: ":")); digits(Int(parts.tm_sec), 2)
        text.append(UInt8(ascii: ".")); digits(milliseconds, 3)
        text.append(UInt8(ascii: "Z"))
        return String(decoding: text, as: UTF8.self)
    }

    static func value(_ text: String?) -> Any { text.map { $0 as Any } ?? NSNull() }
    static func value(_ flag: Bool?) -> Any { flag.map { $0 as Any } ?? NSNull() }
    static func value(_ date: Date?) -> Any { date.map { timestamp($0) as Any } ?? NSNull() }

    static func response(status: Int = 200, _ object: [String: Any]) -> HTTPResponse {
        var body: [UInt8] = []
        body.reserveCapacity(256)
        write(object, to: &body)
        return HTTPResponse(status: status, headers: [("Content-Type", "application/json")], body: body)
    }

    /// The JSON text of an answer: members in key order, `/` unescaped. Written here rather than by
    /// `JSONSerialization`, whose key sorting on Linux goes through ICU collation and was the
    /// largest single cost of a sign-in's answer. Takes exactly the values the bodies above hold.
    static func write(_ value: Any, to out: inout [UInt8]) {
        // Strings first: most values are, and each failed cast costs a dynamic-cast lookup.
        switch value {
        case let text as String: JSONText.appendString(text, to: &out)
        case let flag as Bool: out += flag ? "true".utf8 : "false".utf8
        case let number as Int: out += String(number).utf8
        case let number as Int64: out += String(number).utf8
        case let object as [String: Any]:
            out.append(UInt8(ascii: "{"))
            for (index, key) in object.keys.sorted().enumerated() {
                if index > 0 { out.append(UInt8(ascii: ",")) }
                JSONText.appendString(key, to: &out)
                out.append(UInt8(ascii: ":"))
                write(object[key]!, to: &out)
            }
            out.append(UInt8(ascii: "}"))
        case let array as [Any]:
            out.append(UInt8(ascii: "["))
            for (index, element) in array.enumerated() {
                if index > 0 { out.append(UInt8(ascii: ",")) }
                write(element, to: &out)
            }
            out.append(UInt8(ascii: "]"))
        default:  // NSNull, and anything a body should never hold
            out += "null".utf8
        }
    }

    /// The `siwa.account(...)` view.
    static func account(_ account: AccountView) -> [String: Any] {
        [
            "client_id": account.clientID, "sub": account.sub, "app_user_id": value(account.appUserID),
            "status": account.status.rawValue, "email": value(account.email), "is_private_email": value(account.isPrivateEmail),
            "email_forwarding": value(account.emailForwarding), "sessions_revoked_at": value(account.sessionsRevokedAt),
            "linked_at": value(account.linkedAt), "updated_at": value(account.updatedAt),
            "has_refresh_token": account.hasRefreshToken, "full_name": value(account.fullName),
            "real_user_status": value(account.realUserStatus),
        ]
    }

    static func value(_ members: [String: String]?) -> Any { members.map { $0 as [String: Any] } ?? NSNull() }

    static func change(_ change: AppAPIStore.Change) -> [String: Any] {
        [
            "id": change.id, "client_id": change.clientID, "sub": change.sub, "app_user_id": value(change.appUserID),
            "change": change.change, "status": value(change.status?.rawValue), "reason": value(change.reason),
            "created_at": timestamp(change.createdAt),
        ]
    }
}
