import Accounts
import Postgres

/// One account as the console shows it: the view the app API answers with (`AccountView`, read
/// through the same `siwa.account` and decoded by the same code, so the two cannot show one row
/// differently), and how many earlier tokens it keeps for a deletion to revoke. Never a token's
/// bytes. The view's fields read as the record's own (`account.status`).
@dynamicMemberLookup
struct AccountRecord: Sendable {
    var view: AccountView
    /// Earlier tokens kept for a deletion to revoke.
    var retiredTokens: Int

    subscript<Value>(dynamicMember member: KeyPath<AccountView, Value>) -> Value { view[keyPath: member] }

    static func find(clientID: String, sub: String, on connection: PostgresConnection) async throws -> AccountRecord? {
        try await connection.query(
            """
            SELECT a.*, siwa.retired_token_count(a.client_id, a.sub) AS retired_tokens
              FROM siwa.account(\(clientID), \(sub)) a
            """
        ).first.map(Self.init(row:))
    }

    /// Accounts whose `sub` or `app_user_id` is exactly `text`, most recently changed first.
    static func search(_ text: String, limit: Int = 100, on connection: PostgresConnection) async throws -> [AccountRecord] {
        try await connection.query(
            """
            SELECT a.*, siwa.retired_token_count(a.client_id, a.sub) AS retired_tokens
              FROM siwa.find_accounts(\(text), \(Int32(clamping: limit))) f CROSS JOIN LATERAL siwa.account(f.client_id, f.sub) a
             ORDER BY a.updated_at DESC
            """
        ).map(Self.init(row:))
    }

    private init(row: PostgresRow) throws {
        view = try AccountView(row)
        retiredTokens = try row.decode(Int.self, column: "retired_tokens")
    }
}
