import Foundation
import Postgres

/// One account as the console shows it: never a token, only whether one is held.
struct AccountRecord: Sendable {
    var clientID: String
    var sub: String
    var appUserID: String?
    var status: String
    var email: String?
    var isPrivateEmail: Bool?
    var emailForwarding: String?
    var sessionsRevokedAt: Date?
    var linkedAt: Date?
    var updatedAt: Date
    var holdsRefreshToken: Bool
    /// Earlier tokens kept for a deletion to revoke.
    var retiredTokens: Int

    // The token columns are read only as "is there one", never their bytes.
    private static let columns = """
        SELECT client_id, sub, app_user_id, status, email, is_private_email, email_forwarding, sessions_revoked_at,
               linked_at, updated_at, refresh_token_enc IS NOT NULL AS holds_token,
               coalesce(cardinality(retired_tokens_enc), 0) AS retired
          FROM siwa.accounts
        """

    static func find(clientID: String, sub: String, on connection: PostgresConnection) async throws -> AccountRecord? {
        try await connection.query("\(unsafeSQL: Self.columns) WHERE client_id = \(clientID) AND sub = \(sub)").first.map(Self.init(row:))
    }

    /// Accounts whose `sub` or `app_user_id` is exactly `text`, most recently changed first.
    static func search(_ text: String, limit: Int = 100, on connection: PostgresConnection) async throws -> [AccountRecord] {
        try await connection.query(
            "\(unsafeSQL: Self.columns) WHERE sub = \(text) OR app_user_id = \(text) ORDER BY updated_at DESC LIMIT \(limit)"
        ).map(Self.init(row:))
    }

    private init(row: PostgresRow) throws {
        clientID = try row.decode(String.self, column: "client_id")
        sub = try row.decode(String.self, column: "sub")
        appUserID = try row.decode(String?.self, column: "app_user_id")
        status = try row.decode(String.self, column: "status")
        email = try row.decode(String?.self, column: "email")
        isPrivateEmail = try row.decode(Bool?.self, column: "is_private_email")
        emailForwarding = try row.decode(String?.self, column: "email_forwarding")
        sessionsRevokedAt = try row.decode(Date?.self, column: "sessions_revoked_at")
        linkedAt = try row.decode(Date?.self, column: "linked_at")
        updatedAt = try row.decode(Date.self, column: "updated_at")
        holdsRefreshToken = try row.decode(Bool.self, column: "holds_token")
        retiredTokens = try row.decode(Int.self, column: "retired")
    }
}
