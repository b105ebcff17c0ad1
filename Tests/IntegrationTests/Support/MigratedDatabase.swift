import Foundation
import Logging
import Postgres

/// A fresh database with every migration applied (a copy of `TestDatabase.migratedTemplate()`). Our SQL lives in the fixed schema `siwa`, so
/// tests isolate by database rather than by schema: each test gets `test_<random>` of its own.
struct MigratedDatabase: Sendable {
    let name: String
    /// URI of this database, for connections and for child processes' `DATABASE_URL`.
    let url: String
    private let adminURL: String

    /// `migrated: false` leaves it empty (a receiver started before `siwa migrate`).
    static func make(migrated: Bool = true) async throws -> MigratedDatabase {
        let base = try await TestDatabase.shared.baseURL()
        let template = try await TestDatabase.shared.migratedTemplate()
        let name = "test_" + String(UInt64.random(in: 0...UInt64.max), radix: 36)
        let admin = try await PostgresConnection.connect(to: base, logger: TestDatabase.logger)
        defer { admin.close() }
        if !migrated {
            try await admin.simpleQuery("CREATE DATABASE \(name)")
            return MigratedDatabase(name: name, url: Self.url(base, database: name), adminURL: base)
        }
        try await admin.simpleQuery("CREATE DATABASE \(name) TEMPLATE \(template)")
        return MigratedDatabase(name: name, url: Self.url(base, database: name), adminURL: base)
    }

    func connect() async throws -> PostgresConnection {
        try await PostgresConnection.connect(to: url, logger: TestDatabase.logger)
    }

    /// Drops the database, ending any session still connected to it.
    func drop() async {
        guard let admin = try? await PostgresConnection.connect(to: adminURL, logger: TestDatabase.logger) else {
            return
        }
        defer { admin.close() }
        try? await admin.simpleQuery("DROP DATABASE IF EXISTS \(name) WITH (FORCE)")
    }

    /// Replaces the database name in a `postgresql://` URI, or `dbname` in key=value conninfo. The
    /// URI's hosts may be libpq's comma-separated list (`h1:5432,h2:5432`), which URLComponents
    /// cannot parse, so the path is found by hand: from the first `/` after the hosts to the `?`.
    static func url(_ base: String, database: String) -> String {
        if let scheme = base.range(of: "://") {
            let rest = base[scheme.upperBound...]
            let hostsEnd = rest.firstIndex { $0 == "/" || $0 == "?" } ?? rest.endIndex
            let query = rest[hostsEnd...].firstIndex(of: "?").map { rest[$0...] } ?? ""
            return base[..<hostsEnd] + "/" + database + query
        }
        let parts = base.split(separator: " ").filter { !$0.hasPrefix("dbname=") }
        return (parts + ["dbname=\(database)"]).joined(separator: " ")
    }
}

extension MigratedDatabase {
    /// Runs `body` with the URL of a new login in the receiver's group role (as an operator
    /// creates one: `CREATE ROLE … LOGIN IN ROLE siwa_receiver`), dropped afterwards: roles are
    /// cluster-wide.
    func withReceiverLogin<T>(_ body: (_ url: String) async throws -> T) async throws -> T {
        try await withLogin(inRole: "siwa_receiver", body)
    }

    /// Runs `body` with the URL of a new login in `group` (no other privilege), dropped afterwards.
    func withLogin<T>(inRole group: String, _ body: (_ url: String) async throws -> T) async throws -> T {
        let user = group.replacingOccurrences(of: "siwa_", with: "") + "_" + String(UInt32.random(in: 0...UInt32.max), radix: 36)
        let admin = try await connect()
        defer { admin.close() }
        try await admin.simpleQuery("CREATE ROLE \(user) LOGIN IN ROLE \(group)")
        func dropUser() async { try? await admin.simpleQuery("DROP OWNED BY \(user); DROP ROLE \(user)") }
        do {
            let value = try await body(url.replacingOccurrences(of: "postgres@", with: "\(user)@"))
            await dropUser()
            return value
        } catch {
            await dropUser()
            throw error
        }
    }
}

/// Runs `body` against a fresh migrated (or, with `migrated: false`, empty) database and drops it afterwards.
func withMigratedDatabase<T>(migrated: Bool = true, _ body: (MigratedDatabase) async throws -> T) async throws -> T {
    let database = try await MigratedDatabase.make(migrated: migrated)
    do {
        let value = try await body(database)
        await database.drop()
        return value
    } catch {
        await database.drop()
        throw error
    }
}
