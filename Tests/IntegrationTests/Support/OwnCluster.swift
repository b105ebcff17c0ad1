import LocalPostgres
import Migrations
import Postgres

/// A cluster for a test that stops and starts PostgreSQL (the shared one must stay up).
enum LocalPostgresClusterForTest {
    static func start() async throws -> LocalPostgresCluster {
        try await LocalPostgresCluster.start(logger: TestDatabase.logger)
    }
}

enum SiwaMigrations {
    static func apply(_ connection: PostgresConnection) async throws {
        try await Migrator(logger: TestDatabase.logger).migrate(connection)
    }
}
