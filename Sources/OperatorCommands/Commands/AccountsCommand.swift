import Foundation
import Logging
import Postgres
import Settings
import StoredTokens

/// `siwa accounts import` (lines `client_id,sub,app_user_id,refresh_token` on stdin) and
/// `siwa accounts rotate-keys` (re-encrypt tokens not sealed with the first of `SIWA_TOKEN_KEYS`);
/// `siwa accounts transfer` is `AccountsTransferCommand`.
enum AccountsCommand: CLICommand {
    static let name = "accounts"
    static let summary = "import linked accounts (import), re-encrypt tokens (rotate-keys), move users to another team (transfer)"

    static func run(_ source: ConfigurationSource) async -> Int32 {
        if source.positional.first == "transfer" { return await AccountsTransferCommand.run(source) }
        let databaseURL: String
        let tokenBox: TokenBox
        let logLevel: Logger.Level
        let action = source.positional.first ?? ""
        do {
            guard ["import", "rotate-keys"].contains(action) else {
                throw ConfigurationError(variable: "accounts", problem: "expected import, rotate-keys or transfer")
            }
            databaseURL = try CommonSettings.databaseURL(source)
            logLevel = try CommonSettings(source).logLevel
            do { tokenBox = try TokenBox(configuration: try source.require("SIWA_TOKEN_KEYS")) } catch let error as TokenBoxError {
                throw ConfigurationError(variable: "SIWA_TOKEN_KEYS", problem: "\(error)".replacingOccurrences(of: "SIWA_TOKEN_KEYS: ", with: ""))
            }
        } catch {
            FileHandle.standardError.write(Data("siwa accounts: \(error)\n".utf8))
            return 2
        }
        let logger = Logger(label: "siwa-accounts", level: logLevel)
        do {
            let connection = try await PostgresConnection.connect(to: databaseURL, applicationName: "siwa-accounts", logger: logger)
            defer { connection.close() }
            if action == "import" {
                let importer = AccountImporter(connection: connection, tokenBox: tokenBox) { summary in
                    print("\(summary.lines) lines read, \(summary.imported) imported")
                }
                let summary = try await importer.run(lines: StandardInputLines())
                for line in summary.malformedLines {
                    FileHandle.standardError.write(Data("siwa accounts import: line \(line): malformed (expected client_id,sub,app_user_id,refresh_token), skipped\n".utf8))
                }
                print("\(summary.lines) lines, \(summary.imported) imported, \(summary.skipped) skipped (not active), \(summary.malformedLines.count) malformed")
                return summary.malformedLines.isEmpty ? 0 : 1
            } else {
                let rotation = TokenKeyRotation(connection: connection, tokenBox: tokenBox)
                print("\(try await rotation.remaining()) tokens to re-encrypt with key \(tokenBox.currentKeyID)")
                let summary = try await rotation.run { summary in
                    print("\(summary.reencrypted) re-encrypted, \(summary.failed) failed")
                }
                print("done: \(summary.reencrypted) re-encrypted, \(summary.failed) could not be opened with any key")
                return summary.failed == 0 ? 0 : 1
            }
        } catch {
            CLI.error(name, CLI.databaseProblem(error))
            return 1
        }
    }
}

/// Lines of standard input, read lazily.
struct StandardInputLines: Sequence, IteratorProtocol {
    mutating func next() -> String? { readLine(strippingNewline: true) }
}
