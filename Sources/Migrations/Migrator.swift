package import Logging
package import Postgres

/// Brings a database up to this release's schema: applies `sql/NNN_*.sql` (embedded in the binary)
/// in order, each in its own transaction, then every `sql/functions/*.sql` file whose text differs
/// from the one last applied, all in one transaction. Everything runs under one advisory lock, so
/// two `siwa migrate` runs at once apply each file once.
package struct Migrator: Sendable {
    /// Chosen once; any process migrating this database takes the same lock.
    static let advisoryLockKey: Int64 = 0x5_1_1A_0001

    /// What one run changed.
    package struct Report: Sendable, Equatable {
        /// Numbered migrations applied, in order.
        package var versions: [Int] = []
        /// Function files (re)applied, in order.
        package var functionFiles: [String] = []

        /// Group roles of 003_roles.sql that do not exist after the run: the migrating login may
        /// not create roles (neither superuser nor CREATEROLE), so their grants were skipped.
        package var missingRoles: [String] = []

        package var isEmpty: Bool { versions.isEmpty && functionFiles.isEmpty }

        /// For stderr when roles are missing: the processes' logins cannot be made members of them.
        package var warning: String? {
            guard !missingRoles.isEmpty else { return nil }
            return "the roles \(missingRoles.joined(separator: ", ")) do not exist: this login may not create roles "
                + "(neither superuser nor CREATEROLE), so their grants were skipped. Run siwa migrate as a login with "
                + "CREATEROLE, or have a DBA run CREATE ROLE <name> NOLOGIN for each and run siwa migrate again."
        }

        /// One line for an operator: "up to date", or what was applied.
        package var summary: String {
            var parts: [String] = []
            if !versions.isEmpty { parts.append("migrations \(versions.map(String.init).joined(separator: ", "))") }
            if !functionFiles.isEmpty { parts.append("functions \(functionFiles.joined(separator: ", "))") }
            return parts.isEmpty ? "up to date" : "applied " + parts.joined(separator: "; ")
        }
    }

    package var migrations: [Migration]
    package var functions: [FunctionDefinitions]
    package var logger: Logger

    package init(
        migrations: [Migration] = Migration.embedded, functions: [FunctionDefinitions] = FunctionDefinitions.embedded,
        logger: Logger
    ) {
        self.migrations = migrations
        self.functions = functions
        self.logger = logger
    }

    @discardableResult
    package func migrate(_ connection: PostgresConnection) async throws -> Report {
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
            CREATE TABLE IF NOT EXISTS siwa.schema_functions (
                name       text PRIMARY KEY,
                definition text        NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now()
            );
            COMMIT;
            """)
        var report = Report()
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
                report.versions.append(migration.version)
                logger.info("migration applied", metadata: ["migration": .string(migration.name)])
            }
        }
        report.functionFiles = try await applyFunctions(connection)
        for name in report.functionFiles {
            logger.info("functions applied", metadata: ["functions": .string(name)])
        }
        report.missingRoles = try await Self.missingRoles(connection)
        return report
    }

    /// The group roles every process's login is made a member of (sql/003_roles.sql).
    package static let groupRoles = ["siwa_receiver", "siwa_worker", "siwa_app"]

    /// Which of `names` no role of the cluster has.
    package static func missingRoles(_ connection: PostgresConnection, names: [String] = groupRoles) async throws -> [String] {
        try await connection.query(
            """
            SELECT r FROM unnest(\(names)::text[]) WITH ORDINALITY AS n(r, i)
             WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r) ORDER BY i
            """
        ).map { try $0.decode(String.self, at: 0) }
    }

    /// Applies the function files whose text changed, in name order, in one transaction: a
    /// release's functions arrive together or not at all. Bodies are not checked at creation
    /// (as pg_dump does), so a file may call a function defined in a later one.
    private func applyFunctions(_ connection: PostgresConnection) async throws -> [String] {
        let files = functions.sorted(by: { $0.name < $1.name })
        return try await connection.withTransaction { connection in
            _ = try await connection.query("SELECT pg_advisory_xact_lock(\(Self.advisoryLockKey))")
            _ = try await connection.execute("SET LOCAL check_function_bodies = off")
            var applied: [String] = []
            for file in files {
                let current = try await connection.query(
                    "SELECT 1 FROM siwa.schema_functions WHERE name = \(file.name) AND definition = \(file.sql)")
                guard current.isEmpty else { continue }
                try await connection.simpleQuery(file.sql)
                _ = try await connection.execute(
                    """
                    INSERT INTO siwa.schema_functions (name, definition) VALUES (\(file.name), \(file.sql))
                    ON CONFLICT (name) DO UPDATE SET definition = EXCLUDED.definition, applied_at = now()
                    """)
                applied.append(file.name)
            }
            return applied
        }
    }
}
