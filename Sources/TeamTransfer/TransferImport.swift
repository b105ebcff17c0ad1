package import AppleClient
import Foundation
package import Logging
package import Postgres

/// `siwa accounts transfer import` (recipient team): records each `transfer_sub,app_user_id` line
/// in `siwa.transfer_imports`, then exchanges every pending line at Apple for the user's `sub` under
/// this team and completes it with `siwa.complete_transfer` (creates or re-keys the account). Both
/// steps are resumable: recording the same file again changes nothing, and only lines still
/// `pending` are exchanged (a sign-in may have completed some meanwhile).
package struct TransferImport {
    package struct RecordSummary: Sendable, Equatable {
        package var lines = 0
        /// Lines not recorded before.
        package var recorded = 0
        /// Lines recorded by an earlier run (same `transfer_sub`, same `app_user_id`).
        package var alreadyRecorded = 0
        package var malformedLines: [Int] = []
        /// Lines whose `transfer_sub` was recorded with another `app_user_id` (earlier in the file or an earlier run).
        package var conflictingLines: [Int] = []
    }

    package struct ExchangeSummary: Sendable, Equatable {
        /// Lines of this client ID that were pending when the run started.
        package var pending = 0
        package var completed = 0
        /// Completed by a sign-in meanwhile, or skipped: the account is being deleted or was deleted.
        package var notNeeded = 0
        package var skipped = 0
        package var failures: [String: Int] = [:]
        package var failed: Int { failures.values.reduce(0, +) }
        package var remaining: Int { pending - completed - notNeeded - skipped }
    }

    let connection: PostgresConnection
    let client: AppleAuthClient
    let clientID: String
    let settings: MigrationCallSettings
    let logger: Logger
    let batchSize = 500

    package init(
        connection: PostgresConnection, client: AppleAuthClient, clientID: String, settings: MigrationCallSettings,
        logger: Logger
    ) {
        self.connection = connection
        self.client = client
        self.clientID = clientID
        self.settings = settings
        self.logger = logger
    }

    // MARK: Recording

    /// Records every well-formed line. Malformed and conflicting lines are reported by number
    /// (never their content) and skipped.
    package func record(lines: some Sequence<String>) async throws -> RecordSummary {
        var summary = RecordSummary()
        var seen: [String: String] = [:]  // transfer_sub → app_user_id, first line wins
        var batch: [(line: Int, transferSub: String, appUserID: String)] = []
        for line in lines {
            summary.lines += 1
            switch TransferFile.parse(line) {
            case .skip: continue
            case .malformed: summary.malformedLines.append(summary.lines)
            case .entry(let transferSub, let appUserID):
                if let earlier = seen[transferSub] {
                    if earlier != appUserID { summary.conflictingLines.append(summary.lines) }
                    continue
                }
                seen[transferSub] = appUserID
                batch.append((summary.lines, transferSub, appUserID))
                if batch.count >= batchSize { try await flush(&batch, into: &summary) }
            }
        }
        try await flush(&batch, into: &summary)
        return summary
    }

    private func flush(_ batch: inout [(line: Int, transferSub: String, appUserID: String)], into summary: inout RecordSummary) async throws {
        guard !batch.isEmpty else { return }
        let rows = batch
        batch.removeAll()
        let transferSubs = rows.map(\.transferSub)
        let recordedBefore = try await connection.query(
            "SELECT transfer_sub, app_user_id FROM siwa.record_transfer_lines(\(clientID), \(transferSubs)::text[], \(rows.map(\.appUserID))::text[])")
        let existing = try recordedBefore.reduce(into: [String: String]()) {
            $0[try $1.decode(String.self, column: "transfer_sub")] = try $1.decode(String.self, column: "app_user_id")
        }
        for row in rows {
            switch existing[row.transferSub] {
            case nil: summary.recorded += 1
            case row.appUserID?: summary.alreadyRecorded += 1
            default: summary.conflictingLines.append(row.line)
            }
        }
    }

    // MARK: Exchanging

    /// Exchanges every pending line of this client ID. Throws `MigrationConfigurationFault` when
    /// Apple refuses the credentials.
    package func exchangePending(progressEvery: Int = 100, progress: @Sendable (ExchangeSummary) -> Void) async throws
        -> ExchangeSummary
    {
        var summary = ExchangeSummary()
        summary.pending = try await connection.query(
            "SELECT count(*) FROM siwa.transfer_imports WHERE client_id = \(clientID) AND state = 'pending'"
        )[0].decode(Int.self, at: 0)
        progress(summary)
        let caller = MigrationCaller(client: client, clientID: clientID, settings: settings, logger: logger)
        var after = ""
        var reported = 0
        while true {
            let transferSubs = try await connection.query(
                """
                SELECT transfer_sub FROM siwa.transfer_imports
                 WHERE client_id = \(clientID) AND state = 'pending' AND transfer_sub > \(after)
                 ORDER BY transfer_sub LIMIT \(batchSize)
                """
            ).map { try $0.decode(String.self, at: 0) }
            guard let last = transferSubs.last else { break }
            after = last
            for outcome in try await exchange(transferSubs, caller: caller) {
                switch outcome {
                case .completed: summary.completed += 1
                case .notNeeded: summary.notNeeded += 1
                case .skipped: summary.skipped += 1
                case .failed(let reason): summary.failures[reason, default: 0] += 1
                }
                let handled = summary.completed + summary.notNeeded + summary.skipped + summary.failed
                if handled - reported >= progressEvery {
                    reported = handled
                    progress(summary)
                }
            }
        }
        return summary
    }

    enum LineOutcome: Sendable { case completed, notNeeded, skipped, failed(String) }

    private func exchange(_ transferSubs: [String], caller: MigrationCaller) async throws -> [LineOutcome] {
        let (client, clientID, connection) = (client, clientID, connection)
        return try await withThrowingTaskGroup(of: LineOutcome.self) { group in
            var results: [LineOutcome] = []
            var next = transferSubs.makeIterator()
            func add(_ transferSub: String) {
                group.addTask {
                    // A sign-in may have completed the line since the batch was read: skip the call.
                    let state = try await connection.query(
                        "SELECT state FROM siwa.transfer_imports WHERE client_id = \(clientID) AND transfer_sub = \(transferSub)"
                    ).first.map { try $0.decode(String.self, at: 0) }
                    guard state == "pending" else { return .notNeeded }
                    let outcome = try await caller.perform { token in
                        await client.migratedIdentity(transferSub: transferSub, clientID: clientID, accessToken: token)
                    }
                    switch outcome {
                    case .failed(let reason):
                        _ = try await connection.query(
                            "SELECT siwa.transfer_import_failed(\(clientID), \(transferSub), \(reason))")
                        return .failed(reason)
                    case .success(let identity):
                        let rows = try await connection.query(
                            """
                            SELECT siwa.complete_transfer(\(clientID), \(transferSub), \(identity.sub), \(identity.email),
                                                          \(identity.isPrivateEmail), 'import') AS app_user_id
                            """)
                        return try rows[0].decode(String?.self, column: "app_user_id") == nil ? .skipped : .completed
                    }
                }
            }
            for _ in 0..<max(1, settings.concurrency) {
                guard let transferSub = next.next() else { break }
                add(transferSub)
            }
            while let outcome = try await group.next() {
                results.append(outcome)
                if let transferSub = next.next() { add(transferSub) }
            }
            return results
        }
    }

    /// Lines of this client ID not yet done (pending), for the final status.
    package func pendingCount() async throws -> Int {
        try await connection.query(
            "SELECT count(*) FROM siwa.transfer_imports WHERE client_id = \(clientID) AND state = 'pending'"
        )[0].decode(Int.self, at: 0)
    }
}
