package import Postgres

/// `siwa accounts rotate-keys`: re-encrypts every stored token whose key is not the first of
/// `SIWA_TOKEN_KEYS`, in batches. Resumable: it selects by key id, so a rerun continues.
package struct TokenKeyRotation {
    package struct Summary: Sendable, Equatable {
        package var reencrypted = 0
        /// Rows whose token would not open with any key (reported, left as they are).
        package var failed = 0
    }

    let connection: PostgresConnection
    let tokenBox: TokenBox
    let batchSize: Int

    package init(connection: PostgresConnection, tokenBox: TokenBox, batchSize: Int = 500) {
        self.connection = connection
        self.tokenBox = tokenBox
        self.batchSize = batchSize
    }

    /// Tokens still sealed with another key (current and retired ones: a deletion revokes both).
    package func remaining() async throws -> Int {
        let current = Array(tokenBox.currentKeyID.utf8)
        let rows = try await connection.query("SELECT siwa.tokens_sealed_with_other_keys(\(current))")
        return try rows[0].decode(Int.self, at: 0)
    }

    package func run(progress: (Summary) -> Void = { _ in }) async throws -> Summary {
        let current = Array(tokenBox.currentKeyID.utf8)
        var summary = Summary()
        try await resealPages(into: &summary, progress: progress, tokenColumn: "refresh_token_enc") { after, limit in
            "SELECT * FROM siwa.current_tokens_to_reseal(\(current), \(after.clientID), \(after.sub), \(limit)::integer)"
        }
        // The tokens kept for a later deletion (`retired_tokens_enc`): a page is `limit` accounts,
        // each with its tokens, one row a token.
        try await resealPages(into: &summary, progress: progress, tokenColumn: "token") { after, limit in
            "SELECT * FROM siwa.retired_tokens_to_reseal(\(after.clientID), \(after.sub), \(limit)::integer)"
        }
        return summary
    }

    private typealias AccountKey = (clientID: String, sub: String)

    /// Walks the pages `page` gives (ordered by account, after a cursor, `batchSize` accounts at
    /// most), one transaction each: every token not sealed with the current key is opened, sealed
    /// with it and swapped in (`siwa.reseal_token`, sql/functions/token_keys.sql); one that opens
    /// with no key is counted as failed and left. `progress` after each page that did something.
    private func resealPages(
        into summary: inout Summary, progress: (Summary) -> Void, tokenColumn: String,
        page: @escaping @Sendable (_ after: AccountKey, _ limit: Int) -> PostgresQuery
    ) async throws {
        let current = Array(tokenBox.currentKeyID.utf8)
        let box = tokenBox
        let batchSize = batchSize
        var after: AccountKey = ("", "")
        while true {
            let cursor = after
            let (accounts, done, failed, last) = try await connection.withTransaction { connection in
                let rows = try await connection.query(page(cursor, batchSize))
                var (accounts, done, failed, last) = (0, 0, 0, cursor)
                for row in rows {
                    let clientID = try row.decode(String.self, column: "client_id")
                    let sub = try row.decode(String.self, column: "sub")
                    let stored = try row.decode([UInt8].self, column: tokenColumn)
                    if last != (clientID, sub) { accounts += 1 }
                    last = (clientID, sub)
                    guard TokenBox.keyID(of: stored).map({ Array($0.utf8) }) != current else { continue }
                    guard let token = try? box.open(stored, clientID: clientID, sub: sub),
                        let sealed = try? box.seal(token, clientID: clientID, sub: sub)
                    else {
                        failed += 1
                        continue
                    }
                    done += try await connection.query("SELECT siwa.reseal_token(\(clientID), \(sub), \(stored), \(sealed))")[0]
                        .decode(Int.self, at: 0)
                }
                return (accounts, done, failed, last)
            }
            summary.reencrypted += done
            summary.failed += failed
            after = last
            if done + failed > 0 { progress(summary) }
            if accounts < batchSize { break }
        }
    }
}
