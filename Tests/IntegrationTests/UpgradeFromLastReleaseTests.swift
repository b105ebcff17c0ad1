import FakeApple
import Foundation
import Migrations
import Postgres
import Testing

/// A database left by an earlier release (its numbered migrations, which never change, and that
/// release's function files, frozen under `Tests/Fixtures/release-<commit>`) with work in every
/// stage, upgraded by this release's `siwa migrate` and finished by this release's worker: nothing
/// the old release accepted is lost. The last release, and the one before it (a database may skip
/// a release).
@Suite struct UpgradeFromLastReleaseTests {
    struct Release: Sendable, CustomStringConvertible {
        var commit: String
        /// The numbered migrations it shipped.
        var migrations: Set<Int>
        var description: String { commit }

        func functions() throws -> [FunctionDefinitions] {
            let directory = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
                .appendingPathComponent("Fixtures/release-\(commit)/functions")
            return try FileManager.default.contentsOfDirectory(atPath: directory.path).filter { $0.hasSuffix(".sql") }.sorted()
                .map { file in
                    FunctionDefinitions(
                        name: String(file.dropLast(4)),
                        sql: try String(contentsOf: directory.appendingPathComponent(file), encoding: .utf8))
                }
        }
    }

    /// Function files this release renamed (`git mv`, their functions with them), old name → new.
    static let renamed = ["queue": "jobs"]

    /// The first capture of every match of `pattern` in `text`.
    static func names(_ pattern: String, in text: String) throws -> Set<String> {
        Set(text.matches(of: try Regex<(Substring, Substring)>(pattern)).map { String($0.output.1) })
    }

    static let releases = [
        Release(commit: "6e46121", migrations: Set(1...9).union([14])),
        Release(commit: "a000c5f", migrations: Set(1...9).union([14])),
    ]

    @Test(arguments: releases) func workQueuedByARecentReleaseFinishesAfterTheUpgrade(_ release: Release) async throws {
        try await withTeardown { teardown in
            let apple = try FakeAppleForWorkers(stoppedBy: teardown)
            try await withMigratedDatabase(migrated: false) { database in
                let connection = try await database.connect()
                defer { connection.close() }
                let released = try release.functions()
                // A file a release shipped is never dropped (its functions would stay as they were),
                // unless this release renamed it; and every function a release defined is defined
                // again by this one's files, or dropped by them (a function that moved to another
                // file, or out of a renamed one, is not left as that release wrote it).
                #expect(Set(released.map { Self.renamed[$0.name] ?? $0.name }).isSubset(of: FunctionDefinitions.embedded.map(\.name)))
                let current = FunctionDefinitions.embedded.map(\.sql).joined(separator: "\n")
                let kept = try Self.names(#"CREATE OR REPLACE FUNCTION siwa\.(\w+)"#, in: current)
                    .union(try Self.names(#"DROP FUNCTION IF EXISTS siwa\.(\w+)"#, in: current))
                let defined = try Self.names(#"CREATE OR REPLACE FUNCTION siwa\.(\w+)"#, in: released.map(\.sql).joined(separator: "\n"))
                #expect(defined.subtracting(kept).isEmpty, "defined by \(release), then by nothing: \(defined.subtracting(kept).sorted())")
                try await Migrator(
                    migrations: Migration.embedded.filter { release.migrations.contains($0.version) }, functions: released,
                    logger: TestDatabase.logger
                ).migrate(connection)

                // What the last release's app and receiver left behind: a link not yet exchanged; a
                // link followed by its deletion (the deletion waits for the exchange, then revokes
                // its token); a deletion with nothing to revoke; a notification not yet applied.
                let client = FakeAppleForWorkers.clientID
                for (sub, user) in [("up-linked", "user-1"), ("up-deleted", "user-2")] {
                    let code = apple.fake.registerCode(
                        clientID: client, sub: sub, email: "\(sub)@privaterelay.appleid.com", isPrivateEmail: true)
                    _ = try await connection.query("SELECT siwa.link_account(\(client), \(sub), \(user), \(code))")
                }
                _ = try await connection.query("SELECT siwa.request_deletion(\(client), 'up-deleted')")
                _ = try await connection.query("SELECT siwa.request_deletion(\(client), 'up-no-token')")
                try await connection.simpleQuery(
                    """
                    INSERT INTO siwa.notifications (jti, client_id, sub, event_type, event_time, claims, jws)
                    VALUES ('up-1', 'com.example.app', 'up-notified', 'consent-revoked', now(), '{}', 'x.y.z')
                    """)

                // That release let any app session claim a transfer line for any sub; the upgrade takes it back.
                let appMayClaim: PostgresQuery = """
                    SELECT has_function_privilege('siwa_app', 'siwa.claim_transfer(text, text, text, text, boolean)', 'EXECUTE')
                    """
                #expect(try await connection.query(appMayClaim)[0].decode(Bool.self, at: 0))

                let upgrade = try await Migrator(logger: TestDatabase.logger).migrate(connection)
                #expect(try await connection.query(appMayClaim)[0].decode(Bool.self, at: 0) == false)
                #expect(upgrade.versions == Migration.embedded.map(\.version).filter { !release.migrations.contains($0) })
                let changed = FunctionDefinitions.embedded.filter { current in
                    released.first { $0.name == current.name }?.sql != current.sql
                }
                #expect(upgrade.functionFiles == changed.map(\.name).sorted())

                let worker = try database.startWorker(apple.environment)
                teardown.add { await worker.stop() }
                let open = "SELECT count(*) FROM siwa.jobs WHERE state NOT IN ('completed', 'discarded', 'cancelled')"
                try await connection.waitFor(PostgresQuery(unsafeSQL: open), timeout: .seconds(60)) { $0 == 0 }

                let accounts = try await connection.query(
                    """
                    SELECT sub, status, refresh_token_enc IS NOT NULL AS has_token,
                           (SELECT reason FROM siwa.account_changes c
                             WHERE c.client_id = a.client_id AND c.sub = a.sub AND c.change = 'deleted') AS deleted_reason
                      FROM siwa.accounts a ORDER BY sub
                    """
                ).map {
                    "\(try $0.decode(String.self, column: "sub")) \(try $0.decode(String.self, column: "status"))"
                        + " token=\(try $0.decode(Bool.self, column: "has_token"))"
                        + " reason=\(try $0.decode(String?.self, column: "deleted_reason") ?? "-")"
                }
                #expect(
                    accounts == [
                        "up-deleted deleted token=false reason=revoked",
                        "up-linked active token=true reason=-",
                        "up-no-token deleted token=false reason=no_token",
                        "up-notified consent_revoked token=false reason=-",
                    ])
                #expect(apple.everyTokenRevoked("up-deleted"), "the token the deletion waited for is revoked at Apple")
                let failed = try await connection.int("SELECT count(*) FROM siwa.jobs WHERE state <> 'completed'")
                #expect(failed == 0, "every job the last release queued completed")
            }
        }
    }
}
