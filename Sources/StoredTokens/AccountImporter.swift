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
