import Accounts
import Foundation
package import Postgres
import Metrics
import SiwaModel

/// The app API's database side: one method per statement, each through the functions of
/// `sql/functions/app_api.sql` or the contract's own (`siwa.request_deletion`). A sign-in's three
/// statements (issue, consume, sign in) are prepared on each pooled session, so the server plans
/// them once per session, not on every request. Every call is
/// bounded: the pool's lease wait, then `timeout` for each statement (cancelled at the server when
/// it runs out), so no request waits on the database without end.
package struct AppAPIStore: Sendable {
    let pool: PostgresPool
    var timeout: Duration = .seconds(5)

    package init(pool: PostgresPool, timeout: Duration = .seconds(5)) {
        self.pool = pool
        self.timeout = timeout
    }

    struct Change: Sendable {
        var id: Int64
        var clientID: String
        var sub: String
        var appUserID: String?
        var change: String
        var status: AccountStatus?
        var reason: String?
        var createdAt: Date
    }


    /// `body` on a leased connection, each of its statements bounded by `timeout` (cancelled at
    /// the server when it runs out, or when the request's task is cancelled; see
    /// `PostgresConnection.statementTimeout`).
    func run<T: Sendable>(_ body: @escaping @Sendable (PostgresConnection) async throws -> T) async throws -> T {
        try await PostgresConnection.$statementTimeout.withValue(timeout) {
            try await pool.withConnection { try await body($0) }
        }
    }

    enum NonceIssue: Sendable {
        case issued(expires: Date)
        /// `maximumUnspent` are kept already; the first of them expires in this many seconds.
        case full(retryAfter: Int)
    }

    /// Stores a nonce by its SHA-256 unless `maximumUnspent` unexpired ones are kept already.
    func issueNonce(hash: [UInt8], lifetime: Duration, maximumUnspent: Int) async throws -> NonceIssue {
        try await run { connection in
            let row = try await connection.queryPrepared(
                """
                SELECT * FROM siwa.issue_nonce_bounded(\(hash), make_interval(secs => \(lifetime.seconds)), \(Int32(clamping: maximumUnspent)))
                """)[0]
            if let expires = try row.decode(Date?.self, column: "expires_at") { return .issued(expires: expires) }
            return .full(retryAfter: try row.decode(Int?.self, column: "retry_after") ?? 1)
        }
    }

    /// Spends the nonce with this hash: true when it existed and had not expired.
    func consumeNonce(hash: [UInt8]) async throws -> Bool {
        try await run { connection in
            try await connection.query("SELECT siwa.consume_nonce(\(hash))")[0].decode(Bool.self, at: 0)
        }
    }

    /// Spends the nonce and, in the same statement (one round trip instead of two), reads the
    /// sign-in state of `(clientID, sub)`. The caller uses that state only once the identity token
    /// has proven `sub`; reading it before Apple is called is all `siwa.sign_in` asks of it.
    func consumeNonce(hash: [UInt8], readingStateOf clientID: String, sub: String) async throws -> (
        spent: Bool, state: SignInState
    ) {
        try await run { connection in
            let row = try await connection.queryPrepared(
                "SELECT * FROM siwa.consume_nonce_reading(\(hash), \(clientID), \(sub))")[0]
            return (try row.decode(Bool.self, column: "valid"), try SignInState(row))
        }
    }

    /// Deletes expired nonces (at most `limit`); returns how many.
    package func pruneNonces(limit: Int = 10_000) async throws -> Int {
        try await run { connection in
            // The function takes an integer; a Swift Int binds as bigint, which it does not accept.
            try await connection.query("SELECT siwa.prune_nonces(\(Int32(clamping: limit)))")[0].decode(Int.self, at: 0)
        }
    }

    /// `siwa.account(...)`: the account without its tokens.
    func account(clientID: String, sub: String) async throws -> AccountView? {
        try await run { connection in
            try await connection.query("SELECT * FROM siwa.account(\(clientID), \(sub))").first.map(AccountView.init)
        }
    }

    /// What a sign-in needs to know before calling Apple, and how many deletions had been requested
    /// for the account (`siwa.sign_in` lets any request counted after this read win).
    struct SignInState: Sendable {
        var status: AccountStatus?
        var hasRefreshToken: Bool
        var deletionRequests: Int64

        /// From `siwa.sign_in_state`'s columns (no account: no status, no token, no deletion).
        init(_ row: PostgresRow) throws {
            status = try row.decode(AccountStatus?.self, column: "status")
            hasRefreshToken = try row.decode(Bool.self, column: "has_refresh_token")
            deletionRequests = try row.decode(Int64.self, column: "deletion_requests")
        }
    }

    func signInState(clientID: String, sub: String) async throws -> SignInState {
        try await run { connection in
            try SignInState(try await connection.query("SELECT * FROM siwa.sign_in_state(\(clientID), \(sub))")[0])
        }
    }

    /// The sign-in event (`siwa.sign_in`): the account after it, and whether no row existed before
    /// it; its status is not `active` when a deletion was requested after the read that counted
    /// `deletionRequestsSeen` (the token is then kept for that deletion, or revoked if it finished).
    func signIn(
        clientID: String, sub: String, email: String?, isPrivateEmail: Bool?, sealedToken: [UInt8]?,
        deletionRequestsSeen: Int64, fullName: [String: String]?, realUserStatus: String?
    ) async throws -> (account: AccountView, isNew: Bool) {
        let name: String? = fullName.map { members in
            var text: [UInt8] = []
            AppAPIJSON.write(members as [String: Any], to: &text)
            return String(decoding: text, as: UTF8.self)
        }
        return try await run { connection in
            let row = try await connection.queryPrepared(
                """
                SELECT * FROM siwa.sign_in(\(clientID), \(sub), \(email), \(isPrivateEmail), \(sealedToken), \(deletionRequestsSeen),
                                           \(name)::jsonb, \(realUserStatus))
                """)[0]
            return (try AccountView(row), try row.decode(Bool.self, column: "is_new"))
        }
    }

    /// A refresh token this request obtained and will not store, revoked by a durable job
    /// (`siwa.revoke_token_later`, retried until Apple answers 200); `sealed` is sealed for
    /// `(clientID, sub)`. Returns the job's id.
    func revokeLater(clientID: String, sub: String, sealed: [UInt8], reason: String) async throws -> Int64 {
        try await run { connection in
            try await connection.query("SELECT siwa.revoke_token_later(\(clientID), \(sub), \(sealed), \(reason))")[0]
                .decode(Int64.self, at: 0)
        }
    }

    /// Team transfer (`sql/functions/transfer.sql`): a sign-in whose token carries `transfer_sub` of an
    /// imported line lands on that line's `app_user_id`; nil when no line matches.
    func claimTransfer(clientID: String, transferSub: String, sub: String, email: String?, isPrivateEmail: Bool?)
        async throws -> String?
    {
        try await run { connection in
            try await connection.query(
                "SELECT siwa.claim_transfer(\(clientID), \(transferSub), \(sub), \(email), \(isPrivateEmail))"
            )[0].decode(String?.self, at: 0)
        }
    }

    /// Returns the updated account, or nil when there is none.
    func setAppUserID(clientID: String, sub: String, appUserID: String?) async throws -> AccountView? {
        try await run { connection in
            try await connection.withTransaction { connection in
                let found = try await connection.query(
                    "SELECT siwa.set_app_user_id(\(clientID), \(sub), \(appUserID))")[0].decode(Bool.self, at: 0)
                guard found else { return nil }
                return try await connection.query("SELECT * FROM siwa.account(\(clientID), \(sub))").first.map(AccountView.init)
            }
        }
    }

    /// `siwa.request_deletion`: its job's id and the account's status after it. Without a code,
    /// only for an account that exists: nil, and nothing created, for an unknown one.
    func requestDeletion(clientID: String, sub: String, authorizationCode: String?) async throws -> (job: Int64, status: AccountStatus)? {
        try await run { connection in
            try await connection.withTransaction { connection in
                let job: Int64?
                if let authorizationCode {
                    job = try await connection.query(
                        "SELECT siwa.request_deletion(\(clientID), \(sub), \(authorizationCode))")[0].decode(Int64.self, at: 0)
                } else {
                    // CASE calls the function only for an account that exists (under its row lock there).
                    job = try await connection.query(
                        """
                        SELECT CASE WHEN EXISTS (SELECT 1 FROM siwa.account(\(clientID), \(sub)))
                                    THEN siwa.request_deletion(\(clientID), \(sub)) END
                        """)[0].decode(Int64?.self, at: 0)
                }
                guard let job else { return nil }
                let status = try await connection.query("SELECT status FROM siwa.account(\(clientID), \(sub))")[0]
                    .decode(AccountStatus.self, at: 0)
                return (job, status)
            }
        }
    }

    func changes(after: Int64, limit: Int) async throws -> [Change] {
        try await run { connection in
            try await connection.query(
                """
                SELECT id, client_id, sub, app_user_id, change, status, reason, created_at
                  FROM siwa.account_changes_after(\(after), \(Int32(limit)))
                """
            ).map { row in
                Change(
                    id: try row.decode(Int64.self, column: "id"), clientID: try row.decode(String.self, column: "client_id"),
                    sub: try row.decode(String.self, column: "sub"), appUserID: try row.decode(String?.self, column: "app_user_id"),
                    change: try row.decode(String.self, column: "change"), status: try row.decode(AccountStatus?.self, column: "status"),
                    reason: try row.decode(String?.self, column: "reason"), createdAt: try row.decode(Date.self, column: "created_at"))
            }
        }
    }
}
