package import AppleClient
import Foundation
package import Postgres

/// `siwa accounts import`: `client_id,sub,app_user_id,refresh_token` lines become active accounts
/// with the token encrypted. A malformed line is reported by number (never its content) and skipped.
package struct AccountImporter {
    package struct Summary: Sendable, Equatable {
        package var lines = 0
        package var imported = 0
        /// Rows that exist with a status other than active (deleted, revoked...): left alone.
        package var skipped = 0
        package var malformedLines: [Int] = []
    }

    let connection: PostgresConnection
    let tokenBox: TokenBox
    /// Called every `progressInterval` lines with the summary so far.
    var progress: (Summary) -> Void
    var progressInterval = 1000

    package init(connection: PostgresConnection, tokenBox: TokenBox, progressInterval: Int = 1000, progress: @escaping (Summary) -> Void = { _ in }) {
        self.connection = connection
        self.tokenBox = tokenBox
        self.progressInterval = progressInterval
        self.progress = progress
    }

    package func run(lines: some Sequence<String>) async throws -> Summary {
        var summary = Summary()
        var pending: [(clientID: String, sub: String, appUserID: String?, sealed: [UInt8])] = []
        for line in lines {
            summary.lines += 1
            let number = summary.lines
            switch Self.parse(line, number: number, tokenBox: tokenBox) {
            case .skip: break
            case .malformed: summary.malformedLines.append(number)
            case .row(let row): pending.append(row)
            }
            if pending.count >= 500 || number % progressInterval == 0 {
                try await flush(&pending, into: &summary)
            }
            if number % progressInterval == 0 { progress(summary) }
        }
        try await flush(&pending, into: &summary)
        return summary
    }

    enum ParsedLine {
        case skip, malformed
        case row((clientID: String, sub: String, appUserID: String?, sealed: [UInt8]))
    }

    static func parse(_ line: String, number: Int, tokenBox: TokenBox) -> ParsedLine {
        let trimmed = line.trimmingCharacters(in: .whitespacesAndNewlines)
        if trimmed.isEmpty || trimmed.hasPrefix("#") || (number == 1 && trimmed == "client_id,sub,app_user_id,refresh_token") {
            return .skip
        }
        let fields = trimmed.split(separator: ",", omittingEmptySubsequences: false).map {
            $0.trimmingCharacters(in: .whitespaces)
        }
        guard fields.count == 4, !fields[0].isEmpty, !fields[1].isEmpty, !fields[3].isEmpty,
            let sealed = try? tokenBox.seal(fields[3], clientID: fields[0], sub: fields[1])
        else { return .malformed }
        return .row((fields[0], fields[1], fields[2].isEmpty ? nil : fields[2], sealed))
    }

    private func flush(
        _ pending: inout [(clientID: String, sub: String, appUserID: String?, sealed: [UInt8])], into summary: inout Summary
    ) async throws {
        guard !pending.isEmpty else { return }
        let rows = pending
        pending.removeAll()
        let imported = try await connection.withTransaction { connection in
            var imported = 0
            for row in rows {
                // The account rules decide (siwa.account_effect's `imported`, sql/functions/accounts.sql):
                // new or active accounts take the token; a deletion keeps it to revoke; others are left alone.
                let taken = try await connection.query(
                    "SELECT siwa.account_imported(\(row.clientID), \(row.sub), \(row.appUserID), \(row.sealed))"
                )[0].decode(Bool.self, at: 0)
                guard taken else { continue }
                imported += 1
            }
            return imported
        }
        summary.imported += imported
        summary.skipped += rows.count - imported
    }
}

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
