package import AppleClient
import Foundation
package import Logging
package import Postgres

/// `siwa accounts transfer export` (sending team): obtains a transfer identifier for every `active`
/// account that has an `app_user_id`, stores it on the account as it arrives (so an interrupted run
/// resumes where it stopped: identifiers already stored for this target team are never asked
/// again), then writes the file: `TransferFile.header` and one line per account.
///
/// Only `active` accounts move: the recipient creates every line's account `active`, so exporting
/// one that is being deleted (or was, or whose user left) would bring it back. The others are
/// counted by status for the operator.
package struct TransferExport {
    package struct Summary: Sendable, Equatable {
        /// Accounts to export (`active`, with an `app_user_id`).
        package var accounts = 0
        /// Accounts of the client ID left out, by status (`no_app_user_id`: active, but nothing to hand over).
        package var skipped: [String: Int] = [:]
        /// Of those, how many already had an identifier for the target when the run started.
        package var alreadyObtained = 0
        package var obtained = 0
        /// Accounts that got no identifier in this run, by Apple's classified answer.
        package var failures: [String: Int] = [:]
        package var failed: Int { failures.values.reduce(0, +) }
        package var missing: Int { accounts - alreadyObtained - obtained }
        package var written = 0
    }

    let connection: PostgresConnection
    let client: AppleAuthClient
    let clientID: String
    let targetTeam: String
    let settings: MigrationCallSettings
    let logger: Logger
    let batchSize = 200

    package init(
        connection: PostgresConnection, client: AppleAuthClient, clientID: String, targetTeam: String,
        settings: MigrationCallSettings, logger: Logger
    ) {
        self.connection = connection
        self.client = client
        self.clientID = clientID
        self.targetTeam = targetTeam
        self.settings = settings
        self.logger = logger
    }

    // Which accounts the file carries (active, with an app_user_id): sql/functions/transfer.sql.

    /// The client IDs that have accounts to export (the command needs exactly one).
    package static func clientIDs(on connection: PostgresConnection) async throws -> [String] {
        try await connection.query("SELECT siwa.transfer_export_client_ids()").map { try $0.decode(String.self, at: 0) }
    }

    /// Obtains the missing identifiers. `progress` gets the summary every `progressEvery` accounts.
    /// Throws `MigrationConfigurationFault` when Apple refuses the credentials.
    package func obtainIdentifiers(progressEvery: Int = 100, progress: @Sendable (Summary) -> Void) async throws -> Summary {
        var summary = Summary()
        for row in try await connection.query("SELECT * FROM siwa.transfer_export_counts(\(clientID), \(targetTeam))") {
            let (what, n) = (try row.decode(String.self, column: "what"), try row.decode(Int.self, column: "n"))
            switch what {
            case "exported": summary.accounts = n
            case "obtained": summary.alreadyObtained = n
            default: summary.skipped[what] = n
            }
        }
        progress(summary)

        let caller = MigrationCaller(client: client, clientID: clientID, settings: settings, logger: logger)
        var after = ""
        var reported = 0
        while true {
            let subs = try await connection.query(
                "SELECT siwa.transfer_export_missing(\(clientID), \(targetTeam), \(after), \(batchSize)::integer)"
            ).map { try $0.decode(String.self, at: 0) }
            guard let last = subs.last else { break }
            after = last
            let outcomes = try await obtain(subs, caller: caller)
            for outcome in outcomes {
                switch outcome {
                case .success: summary.obtained += 1
                case .failed(let reason): summary.failures[reason, default: 0] += 1
                }
                if (summary.obtained + summary.failed) - reported >= progressEvery {
                    reported = summary.obtained + summary.failed
                    progress(summary)
                }
            }
        }
        return summary
    }

    /// Asks for `subs`' identifiers, `settings.concurrency` at a time; each is stored the moment it arrives.
    private func obtain(_ subs: [String], caller: MigrationCaller) async throws -> [MigrationCaller.Outcome<String>] {
        let (client, clientID, targetTeam, connection) = (client, clientID, targetTeam, connection)
        return try await withThrowingTaskGroup(of: MigrationCaller.Outcome<String>.self) { group in
            var results: [MigrationCaller.Outcome<String>] = []
            var next = subs.makeIterator()
            func add(_ sub: String) {
                group.addTask {
                    var outcome = try await caller.perform { token in
                        await client.transferSub(sub: sub, targetTeam: targetTeam, clientID: clientID, accessToken: token)
                    }
                    // An answer with a separator in it would break the file: not kept, asked again next run.
                    if case .success(let transferSub) = outcome, !TransferFile.isIdentifier(transferSub) {
                        outcome = .failed(reason: "malformed_identifier")
                    }
                    if case .success(let transferSub) = outcome {
                        _ = try await connection.query(
                            "SELECT siwa.transfer_export_store(\(clientID), \(sub), \(transferSub), \(targetTeam))")
                    }
                    return outcome
                }
            }
            for _ in 0..<max(1, settings.concurrency) {
                guard let sub = next.next() else { break }
                add(sub)
            }
            while let outcome = try await group.next() {
                results.append(outcome)
                if let sub = next.next() { add(sub) }
            }
            return results
        }
    }

    /// Writes the header and every stored identifier for the target team, in pages, through `write`.
    /// An identifier that cannot be written as one record (stored by an older release) is left out,
    /// forgotten, and its account's `sub` handed to `refused`. Returns how many records were written.
    package func writeFile(_ write: (String) -> Void, refused: (String) -> Void = { _ in }) async throws -> Int {
        write(TransferFile.header + "\n")
        var after = ""
        var written = 0
        while true {
            let rows = try await connection.query(
                "SELECT * FROM siwa.transfer_export_records(\(clientID), \(targetTeam), \(after), 1000)")
            guard !rows.isEmpty else { break }
            var page = ""
            for row in rows {
                after = try row.decode(String.self, column: "sub")
                guard
                    let line = TransferFile.line(
                        transferSub: try row.decode(String.self, column: "transfer_sub"),
                        appUserID: try row.decode(String.self, column: "app_user_id"))
                else {
                    // Forgotten, so the next run asks Apple again.
                    _ = try await connection.query(
                        "SELECT siwa.transfer_export_store(\(clientID), \(after), NULL::text, \(targetTeam))")
                    refused(after)
                    continue
                }
                page += line + "\n"
                written += 1
            }
            write(page)
        }
        return written
    }
}
