import Foundation
internal import HTTPServer

/// An answer other than success: the contract's status and `{"error":"<code>"}`, nothing more.
struct AppAPIError: Error, Sendable, Equatable {
    var status: Int
    var code: String

    static let unauthorized = AppAPIError(status: 401, code: "unauthorized")
    static let badRequest = AppAPIError(status: 400, code: "bad_request")
    static let notFound = AppAPIError(status: 404, code: "not_found")
    static let methodNotAllowed = AppAPIError(status: 405, code: "method_not_allowed")
    static let nonceInvalid = AppAPIError(status: 401, code: "nonce_invalid")
    static let tokenInvalid = AppAPIError(status: 401, code: "token_invalid")
    static let accountDeleting = AppAPIError(status: 403, code: "account_deleting")
    static let accountNotFound = AppAPIError(status: 404, code: "account_not_found")
    static let codeInvalid = AppAPIError(status: 400, code: "code_invalid")
    static let tokenExchangeFailed = AppAPIError(status: 502, code: "token_exchange_failed")
    /// Apple's keys could not be fetched and none is cached for the token's `kid` (the receiver's 503).
    static let keysUnavailable = AppAPIError(status: 503, code: "keys_unavailable")
    /// The database did not answer within its bound, or failed.
    static let databaseUnavailable = AppAPIError(status: 503, code: "database_unavailable")

    var response: HTTPResponse { .json(status: status, #"{"error":"\#(code)"}"#) }
}

/// JSON bodies of the app API's answers.
enum AppAPIJSON {
    /// RFC 3339 in UTC with milliseconds.
    static func timestamp(_ date: Date) -> String {
        date.formatted(Date.ISO8601FormatStyle(includingFractionalSeconds: true))
    }

    static func value(_ text: String?) -> Any { text.map { $0 as Any } ?? NSNull() }
    static func value(_ flag: Bool?) -> Any { flag.map { $0 as Any } ?? NSNull() }
    static func value(_ date: Date?) -> Any { date.map { timestamp($0) as Any } ?? NSNull() }

    static func response(status: Int = 200, _ object: [String: Any]) -> HTTPResponse {
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes])) ?? Data("{}".utf8)
        return HTTPResponse(status: status, headers: [("Content-Type", "application/json")], body: Array(data))
    }

    /// The `siwa.account(...)` view.
    static func account(_ account: AppAPIStore.Account) -> [String: Any] {
        [
            "client_id": account.clientID, "sub": account.sub, "app_user_id": value(account.appUserID),
            "status": account.status, "email": value(account.email), "is_private_email": value(account.isPrivateEmail),
            "email_forwarding": value(account.emailForwarding), "sessions_revoked_at": value(account.sessionsRevokedAt),
            "linked_at": value(account.linkedAt), "updated_at": value(account.updatedAt),
            "has_refresh_token": account.hasRefreshToken,
        ]
    }

    static func change(_ change: AppAPIStore.Change) -> [String: Any] {
        [
            "id": change.id, "client_id": change.clientID, "sub": change.sub, "app_user_id": value(change.appUserID),
            "change": change.change, "status": value(change.status), "reason": value(change.reason),
            "created_at": timestamp(change.createdAt),
        ]
    }
}
