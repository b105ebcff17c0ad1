package import Logging
package import Postgres

/// Applies `sql/NNN_*.sql` (embedded in the binary) in order, each in its own transaction, under
/// an advisory lock so two `siwa migrate` runs at once apply each file once.
package struct Migrator: Sendable {
    /// Chosen once; any process migrating this database takes the same lock.
    static let advisoryLockKey: Int64 = 0x5_1_1A_0001

    package var migrations: [Migration]
    package var logger: Logger

    package init(migrations: [Migration] = Migration.embedded, logger: Logger) {
        self.migrations = migrations
        self.logger = logger
    }

    /// Returns the versions applied by this run (empty when the database was up to date).
    @discardableResult
    package func migrate(_ connection: PostgresConnection) async throws -> [Int] {
        // Even IF NOT EXISTS races between two sessions (a unique violation in the catalog): lock first.
        try await connection.simpleQuery(
            """
            BEGIN;
            SELECT pg_advisory_xact_lock(\(Self.advisoryLockKey));
            CREATE SCHEMA IF NOT EXISTS siwa;
            CREATE TABLE IF NOT EXISTS siwa.schema_migrations (
                version    integer PRIMARY KEY,
                name       text        NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now()
            );
            COMMIT;
            """)
        var applied: [Int] = []
        for migration in migrations.sorted(by: { $0.version < $1.version }) {
            let ran = try await connection.withTransaction { connection in
                // Held until COMMIT: a second migrator waits here, then sees the version recorded.
                _ = try await connection.query("SELECT pg_advisory_xact_lock(\(Self.advisoryLockKey))")
                let done = try await connection.query(
                    "SELECT 1 FROM siwa.schema_migrations WHERE version = \(migration.version)")
                guard done.count == 0 else { return false }
                try await connection.simpleQuery(migration.sql)
                _ = try await connection.execute(
                    "INSERT INTO siwa.schema_migrations (version, name) VALUES (\(migration.version), \(migration.name))")
                return true
            }
            if ran {
                applied.append(migration.version)
                logger.info("migration applied", metadata: ["migration": .string(migration.name)])
            }
        }
        return applied
    }
}
