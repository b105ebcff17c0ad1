import Foundation
import LocalPostgres
import Logging
import Migrations
import Postgres
import Synchronization

/// The cluster to stop and delete when the test process exits.
private let clusterToDestroy = Mutex<LocalPostgresCluster?>(nil)

/// The database integration tests share: the one named by `TEST_DATABASE_URL`, or else one
/// throwaway cluster started on first use and destroyed at process exit. Each test isolates itself in
/// a `test_<random>` schema (`withTestSchema`). A machine without PostgreSQL fails the tests with a
/// message saying how to install it; nothing is skipped.
actor TestDatabase {
    static let shared = TestDatabase()

    static let logger = Logger(label: "integration-tests", level: .warning)

    private var starting: Task<LocalPostgresCluster, any Error>?

    /// `TEST_DATABASE_URL` when set.
    nonisolated var externalURL: String? {
        guard let url = ProcessInfo.processInfo.environment["TEST_DATABASE_URL"], !url.isEmpty else { return nil }
        return url
    }

    /// The shared throwaway cluster (started on first call, even when `TEST_DATABASE_URL` is set).
    func cluster() async throws -> LocalPostgresCluster {
        if let starting { return try await starting.value }
        let task = Task { () async throws -> LocalPostgresCluster in
            // 400 connections, not the default 200: the suites of one pass run side by side, each
            // with its own workers' pools (a worker alone opens up to 9 + 16 + its notification
            // loops), and a full run was seen refusing one with "remaining connection slots are
            // reserved" (ForgedNotificationTests, 6 December).
            let cluster = try await LocalPostgresCluster.start(
                logger: Self.logger, options: LocalPostgresCluster.Options(maxConnections: 400))
            clusterToDestroy.withLock { $0 = cluster }
            atexit { clusterToDestroy.withLock { $0?.destroyBlocking() } }
            return cluster
        }
        starting = task
        return try await task.value
    }

    /// Connection URL (or conninfo) of the shared database.
    func baseURL() async throws -> String {
        if let externalURL { return externalURL }
        return try await cluster().url
    }

    private var migratingTemplate: Task<String, any Error>?

    /// A database migrated once per test process, copied by `CREATE DATABASE ... TEMPLATE` for every
    /// test that needs a migrated database: the migrations run once, not once per test. Nothing
    /// stays connected to it (PostgreSQL refuses to copy a database in use).
    func migratedTemplate() async throws -> String {
        if let migratingTemplate { return try await migratingTemplate.value }
        let task = Task { () async throws -> String in
            let base = try await self.baseURL()
            let name = "template_" + String(UInt64.random(in: 0...UInt64.max), radix: 36)
            let admin = try await PostgresConnection.connect(to: base, logger: Self.logger)
            defer { admin.close() }
            try await admin.simpleQuery("CREATE DATABASE \(name)")
            let connection = try await PostgresConnection.connect(to: MigratedDatabase.url(base, database: name), logger: Self.logger)
            defer { connection.close() }
            try await Migrator(logger: Self.logger).migrate(connection)
            return name
        }
        migratingTemplate = task
        return try await task.value
    }

    /// Creates `test_<random>` and returns it with a conninfo whose `search_path` is that schema.
    func makeSchema() async throws -> TestSchema {
        let base = try await baseURL()
        let name = "test_" + String(UInt64.random(in: 0...UInt64.max), radix: 36)
        let admin = try await PostgresConnection.connect(to: base, logger: Self.logger)
        defer { admin.close() }
        try await admin.simpleQuery("CREATE SCHEMA \(name)")
        return TestSchema(name: name, conninfo: Self.conninfo(base, searchPath: name), baseConninfo: base)
    }

    /// Adds `options=-csearch_path=NAME` to a URI or a key=value conninfo.
    static func conninfo(_ base: String, searchPath: String) -> String {
        if base.contains("://") {
            return base + (base.contains("?") ? "&" : "?") + "options=-csearch_path%3D\(searchPath)"
        }
        return base + " options='-csearch_path=\(searchPath)'"
    }
}

struct TestSchema: Sendable {
    let name: String
    /// Connects with `search_path` set to the schema.
    let conninfo: String
    let baseConninfo: String

    /// `watchingReplies`: as the app API's pool connects (`PostgresConnection.watchesReplies`).
    func connect(watchingReplies: Bool = false) async throws -> PostgresConnection {
        try await PostgresConnection.connect(to: conninfo, watchingReplies: watchingReplies, logger: TestDatabase.logger)
    }

    func drop() async throws {
        let admin = try await PostgresConnection.connect(to: baseConninfo, logger: TestDatabase.logger)
        defer { admin.close() }
        try await admin.simpleQuery("DROP SCHEMA IF EXISTS \(name) CASCADE")
    }
}

/// Runs `body` with a fresh schema and drops it afterwards (also when `body` throws).
func withTestSchema<T>(_ body: (TestSchema) async throws -> T) async throws -> T {
    let schema = try await TestDatabase.shared.makeSchema()
    do {
        let value = try await body(schema)
        try await schema.drop()
        return value
    } catch {
        try? await schema.drop()
        throw error
    }
}
