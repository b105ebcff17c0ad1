import AppleClient
import Foundation
import JobQueue
import Logging
import Postgres
import TeamTransfer
import Settings

/// `siwa accounts transfer export --target-team TEAMID [--client-id ID] > file` (sending team) and
/// `siwa accounts transfer import [--client-id ID] < file` (recipient team): moving the app's users
/// to another developer team (deploy/README.md, "Moving an app to another team"). The team's credentials
/// are the usual `SIWA_TEAM_ID`, `SIWA_KEY_ID`, `SIWA_PRIVATE_KEY_FILE`.
///
/// Exit status: 0 when every account got an identifier (export) / every line is done (import);
/// 1 when some did not (run again: both resume), or Apple refused the credentials; 2 for bad usage.
enum AccountsTransferCommand {
    static let options = ["TARGET_TEAM", "CLIENT_ID", "RATE", "CONCURRENCY"]
    static let variables = [
        "DATABASE_URL", "SIWA_LOG_LEVEL", "SIWA_APPLE_BASE_URL", "SIWA_TEAM_ID", "SIWA_KEY_ID", "SIWA_PRIVATE_KEY_FILE",
        "SIWA_CLIENT_IDS", "SIWA_RETRY_BASE", "SIWA_CA",
    ]

    struct Settings {
        /// `export` or `import`.
        var action: String
        var databaseURL: String
        var logger: Logger
        var client: AppleAuthClient
        var teamID: String
        var calls: MigrationCallSettings
        var clientID: String?
        /// The recipient team (export only).
        var targetTeam: String?
    }

    static func run(_ source: ConfigurationSource) async -> Int32 {
        let settings: Settings
        do { settings = try Self.settings(source) } catch {
            FileHandle.standardError.write(Data("siwa accounts transfer: \(error)\n".utf8))
            return 2
        }
        let command = "accounts transfer \(settings.action)"
        let connection: PostgresConnection
        do {
            connection = try await PostgresConnection.connect(
                to: settings.databaseURL, applicationName: "siwa-accounts-transfer", logger: settings.logger)
        } catch {
            CLI.error(command, CLI.databaseProblem(error))
            return 1
        }
        defer { connection.close() }
        do {
            if let target = settings.targetTeam { return try await export(settings, to: target, connection) }
            return try await importLines(settings, connection)
        } catch let fault as MigrationConfigurationFault {
            CLI.error(command, fault.description)
            return 1
        } catch let unavailable as MigrationUnavailable {
            CLI.error(command, unavailable.description)
            return 1
        } catch let usage as ConfigurationError {
            CLI.error(command, usage.description)
            return 2
        } catch {
            CLI.error(command, CLI.oneLine(error))
            return 1
        }
    }

    // MARK: export

    static func export(_ settings: Settings, to target: String, _ connection: PostgresConnection) async throws -> Int32 {
        let clientID: String
        if let given = settings.clientID {
            clientID = given
        } else {
            let ids = try await TransferExport.clientIDs(on: connection)
            guard ids.count <= 1 else {
                throw ConfigurationError(
                    variable: "--client-id", problem: "accounts exist under several client IDs (\(ids.joined(separator: ", "))): name one")
            }
            guard let only = ids.first else {
                FileHandle.standardOutput.write(Data((TransferFile.header + "\n").utf8))
                progress("transfer export: no account to export")
                return 0
            }
            clientID = only
        }
        let export = TransferExport(
            connection: connection, client: settings.client, clientID: clientID, targetTeam: target,
            settings: settings.calls, logger: settings.logger)
        let summary = try await export.obtainIdentifiers { summary in
            progress(
                "transfer export \(clientID) → \(target): \(summary.alreadyObtained + summary.obtained)/\(summary.accounts) accounts have an identifier (\(summary.obtained) obtained now, \(summary.failed) errors)"
            )
        }
        let written = try await export.writeFile({ FileHandle.standardOutput.write(Data($0.utf8)) }) { sub in
            progress("transfer export: account \(sub): the stored transfer identifier holds a separator, not written (run again to ask Apple anew)")
        }
        var line =
            "transfer export done: \(summary.accounts) active accounts, \(written) lines written, \(summary.alreadyObtained) identifiers from an earlier run, \(summary.obtained) obtained now, \(summary.accounts - written) without an identifier"
        if summary.failed > 0 { line += " (errors: \(breakdown(summary.failures)); run again to retry them)" }
        progress(line)
        if !summary.skipped.isEmpty {
            // Only `active` accounts move: the recipient would bring any other back to `active`.
            progress("transfer export: accounts skipped (not active, or no app_user_id): \(breakdown(summary.skipped))")
        }
        return written == summary.accounts ? 0 : 1
    }

    // MARK: import

    static func importLines(_ settings: Settings, _ connection: PostgresConnection) async throws -> Int32 {
        guard let clientID = settings.clientID else {
            throw ConfigurationError(variable: "--client-id", problem: "is required when SIWA_CLIENT_IDS does not hold exactly one client ID")
        }
        let importer = TransferImport(
            connection: connection, client: settings.client, clientID: clientID, settings: settings.calls, logger: settings.logger)
        let recorded = try await importer.record(lines: StandardInputLines())
        for line in recorded.malformedLines {
            progress("siwa accounts transfer import: line \(line): malformed (expected transfer_sub,app_user_id), skipped")
        }
        for line in recorded.conflictingLines {
            progress("siwa accounts transfer import: line \(line): transfer_sub already recorded with another app_user_id, skipped")
        }
        progress(
            "transfer import \(clientID): \(recorded.lines) lines read, \(recorded.recorded) recorded, \(recorded.alreadyRecorded) recorded earlier, \(recorded.malformedLines.count) malformed, \(recorded.conflictingLines.count) conflicting"
        )
        let exchanged = try await importer.exchangePending { summary in
            progress(
                "transfer import \(clientID): \(summary.completed + summary.notNeeded + summary.skipped)/\(summary.pending) pending lines done (\(summary.failed) errors)"
            )
        }
        let pending = try await importer.pendingCount()
        var line =
            "transfer import done: \(exchanged.completed) accounts created or re-keyed, \(exchanged.notNeeded) completed by sign-in meanwhile, \(exchanged.skipped) skipped (account deleted or being deleted), \(pending) lines still pending"
        if exchanged.failed > 0 { line += " (errors: \(breakdown(exchanged.failures)); run again to retry them)" }
        progress(line)
        let rejected = recorded.malformedLines.count + recorded.conflictingLines.count
        return pending == 0 && rejected == 0 ? 0 : 1
    }

    // MARK: Settings

    static func settings(_ source: ConfigurationSource) throws -> Settings {
        let action = source.positional.dropFirst().first ?? ""
        guard ["export", "import"].contains(action), source.positional.count == 2 else {
            throw ConfigurationError(
                variable: "usage", problem: "siwa accounts transfer export --target-team TEAMID [--client-id ID] > file | siwa accounts transfer import [--client-id ID] < file")
        }
        try source.rejectUnknownFlags(variables + options)
        let databaseURL = try CommonSettings.databaseURL(source)
        let common = try CommonSettings(source)
        let teamID = try source.require("SIWA_TEAM_ID")
        let keyID = try source.require("SIWA_KEY_ID")
        let signer: ClientSecretSigner
        do {
            signer = try ClientSecretSigner(teamID: teamID, keyID: keyID, privateKeyFile: try source.require("SIWA_PRIVATE_KEY_FILE"))
        } catch let error as ConfigurationError {
            throw error
        } catch {
            throw ConfigurationError(variable: "SIWA_PRIVATE_KEY_FILE", problem: "cannot load a P-256 .p8 key from it")
        }
        var calls = MigrationCallSettings()
        let base = try source.duration("SIWA_RETRY_BASE", default: calls.retry.base, range: .milliseconds(10) ... .seconds(60))
        calls.retry = RetryPolicy(base: base, cap: .seconds(60))
        let flags = source.withoutEnvironment()
        if let text = flags.option("rate") {
            guard let rate = Double(text), rate > 0, rate <= 10_000 else {
                throw ConfigurationError(variable: "--rate", problem: "expected calls per second, more than 0 and at most 10000, got \"\(text)\"")
            }
            calls.rate = rate
        }
        calls.concurrency = try flags.integer("CONCURRENCY", default: calls.concurrency, range: 1...64)
        var targetTeam: String?  // set exactly when exporting
        if action == "export", let text = flags.option("target-team") {
            guard text.count == 10, text.allSatisfy({ $0.isASCII && ($0.isUppercase || $0.isNumber) }) else {
                throw ConfigurationError(variable: "--target-team", problem: "expected a Team ID (10 characters, A-Z and 0-9), got \"\(text)\"")
            }
            guard text != teamID else {
                throw ConfigurationError(variable: "--target-team", problem: "is this team (SIWA_TEAM_ID); name the recipient team")
            }
            targetTeam = text
        } else if action == "export" {
            throw ConfigurationError(variable: "--target-team", problem: "is required (the recipient team's ID)")
        }
        var clientID = flags.option("client-id")
        if clientID == nil, action == "import", let ids = try source.list("SIWA_CLIENT_IDS"), ids.count == 1 { clientID = ids[0] }
        let http = AppleHTTP(baseURL: common.appleBaseURL, caCertificates: common.caCertificates)
        return Settings(
            action: action, databaseURL: databaseURL, logger: Logger(label: "siwa-accounts-transfer", level: common.logLevel),
            client: AppleAuthClient(http: http, signer: signer), teamID: teamID, calls: calls, clientID: clientID,
            targetTeam: targetTeam)
    }

    static func progress(_ line: String) {
        FileHandle.standardError.write(Data((line + "\n").utf8))
    }

    static func breakdown(_ failures: [String: Int]) -> String {
        failures.sorted { $0.key < $1.key }.map { "\($0.value) \($0.key)" }.joined(separator: ", ")
    }
}
