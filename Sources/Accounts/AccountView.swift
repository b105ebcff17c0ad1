package import Foundation
import JSON
package import Postgres
package import SiwaModel

/// An account as `siwa.account(...)` shows it: no token, only whether there is one. The one
/// decoding of those columns, for every reader that shows an account: the app API's answers
/// (`siwa.account`, and `siwa.sign_in`, which returns the same columns) and the console's pages
/// (`siwa.account` too), so two readers cannot show one row differently.
package struct AccountView: Sendable, Equatable {
    package var clientID: String
    package var sub: String
    package var appUserID: String?
    package var status: AccountStatus
    package var email: String?
    package var isPrivateEmail: Bool?
    package var emailForwarding: String?
    package var sessionsRevokedAt: Date?
    package var linkedAt: Date?
    package var updatedAt: Date
    package var hasRefreshToken: Bool
    /// The user's name as the client sent it once (`full_name`), member by member.
    package var fullName: [String: String]?
    /// `unsupported`, `unknown` or `likely_real`.
    package var realUserStatus: String?

    /// From a row holding `siwa.account`'s columns (by name: a row may carry more).
    package init(_ row: PostgresRow) throws {
        clientID = try row.decode(String.self, column: "client_id")
        sub = try row.decode(String.self, column: "sub")
        appUserID = try row.decode(String?.self, column: "app_user_id")
        status = try row.decode(AccountStatus.self, column: "status")
        email = try row.decode(String?.self, column: "email")
        isPrivateEmail = try row.decode(Bool?.self, column: "is_private_email")
        emailForwarding = try row.decode(String?.self, column: "email_forwarding")
        sessionsRevokedAt = try row.decode(Date?.self, column: "sessions_revoked_at")
        linkedAt = try row.decode(Date?.self, column: "linked_at")
        updatedAt = try row.decode(Date.self, column: "updated_at")
        hasRefreshToken = try row.decode(Bool.self, column: "has_refresh_token")
        fullName = try row.decode(String?.self, column: "full_name").flatMap(Self.stringMembers)
        realUserStatus = try row.decode(String?.self, column: "real_user_status")
    }

    /// A jsonb object of strings, as stored by `siwa.sign_in`.
    static func stringMembers(_ json: String) -> [String: String]? {
        guard let object = JSONValue.object(Array(json.utf8)) else { return nil }
        return object.compactMapValues(\.stringValue)
    }
}
