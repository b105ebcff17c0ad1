import Foundation
import Logging
import Migrations
import Postgres
import Settings

/// `siwa migrate`: applies the embedded `sql/NNN_*.sql` files not yet recorded in `siwa.schema_migrations`,
/// then the `sql/functions/*.sql` files that changed.
enum MigrateCommand: CLICommand {
    static let name = "migrate"
    static let summary = "apply the SQL migrations (safe to run twice, or from two processes at once)"

    static func run(_ source: ConfigurationSource) async -> Int32 {
        let databaseURL: String
        let settings: CommonSettings
        do {
            databaseURL = try CommonSettings.databaseURL(source)
            settings = try CommonSettings(source)
        } catch {
            FileHandle.standardError.write(Data("siwa migrate: \(error)\n".utf8))
            return 2
        }
        let logger = Logger(label: "siwa-migrate", level: settings.logLevel)
        guard let connection = await CLI.connect(name, url: databaseURL, logger: logger) else { return 1 }
        defer { connection.close() }
        do {
            let applied = try await Migrator(logger: logger).migrate(connection)
            print(applied.summary)
            if let warning = applied.warning { CLI.error(name, warning) }
            return 0
        } catch {
            logger.error("migration failed", metadata: ["error": "\(error)"])
            CLI.error(name, CLI.databaseProblem(error))
            return 1
        }
    }
}
