import Foundation
import LocalPostgres
import Migrations
import Postgres
import Testing

/// `siwa migrate`'s two kinds of SQL: numbered migrations once each, function files whenever their
/// text changed, and an upgrade from the last release's schema.
@Suite struct MigratorTests {
    @Test func functionFilesApplyOnceThenOnlyWhenChanged() async throws {
        try await withEmptyDatabase { url in
            let connection = try await PostgresConnection.connect(to: url, logger: TestDatabase.logger)
            defer { connection.close() }
            let first = try await Migrator(logger: TestDatabase.logger).migrate(connection)
            #expect(first.versions == Migration.embedded.map(\.version))
            #expect(first.functionFiles == FunctionDefinitions.embedded.map(\.name).sorted())

            let second = try await Migrator(logger: TestDatabase.logger).migrate(connection)
            #expect(second.isEmpty, "\(second.summary)")
            #expect(second.summary == "up to date")

            // One rule edited: only its file runs again, and its new text is what the database holds.
            var edited = FunctionDefinitions.embedded
            let index = try #require(edited.firstIndex { $0.name == "accounts" })
            edited[index].sql += "\nCOMMENT ON FUNCTION siwa.record_change(text, text, text, text, text, bigint) IS 'edited';\n"
            let third = try await Migrator(functions: edited, logger: TestDatabase.logger).migrate(connection)
            #expect(third.versions.isEmpty)
            #expect(third.functionFiles == ["accounts"])
            let comment = try await connection.query(
                "SELECT obj_description('siwa.record_change(text, text, text, text, text, bigint)'::regprocedure) AS c")
            #expect(try comment[0].decode(String?.self, column: "c") == "edited")
        }
    }

    /// A database owner that may not create roles: `siwa migrate` succeeds (003 skips the grants)
    /// but says so, naming the roles, instead of a silent "applied" that leaves the processes'
    /// logins nothing to join; migrated again by a login that may, nothing is missing. On a cluster
    /// of its own: the shared one has the roles from every other test.
    @Test func aLoginThatMayNotCreateRolesIsToldWhichAreMissing() async throws {
        let cluster = try await LocalPostgresClusterForTest.start()
        do {
            let admin = try await PostgresConnection.connect(to: cluster.url, logger: TestDatabase.logger)
            defer { admin.close() }
            try await admin.simpleQuery("CREATE ROLE plain_owner LOGIN NOCREATEROLE")
            try await admin.simpleQuery("CREATE DATABASE owned OWNER plain_owner")
            let ownerURL = "postgresql://plain_owner@127.0.0.1:\(cluster.port)/owned"
            let owner = try await PostgresConnection.connect(to: ownerURL, logger: TestDatabase.logger)
            defer { owner.close() }
            let skipped = try await Migrator(logger: TestDatabase.logger).migrate(owner)
            #expect(skipped.versions == Migration.embedded.map(\.version))
            #expect(skipped.missingRoles == Migrator.groupRoles)
            #expect(skipped.warning?.contains("siwa_receiver, siwa_worker, siwa_app do not exist") == true, "\(skipped.warning ?? "no warning")")
            #expect(skipped.warning?.contains("CREATEROLE") == true)

            let superuserURL = "postgresql://postgres@127.0.0.1:\(cluster.port)/owned"
            let superuser = try await PostgresConnection.connect(to: superuserURL, logger: TestDatabase.logger)
            defer { superuser.close() }
            try await superuser.simpleQuery("DELETE FROM siwa.schema_migrations WHERE version = 3")  // 003 again, as a DBA would
            let granted = try await Migrator(logger: TestDatabase.logger).migrate(superuser)
            #expect(granted.versions == [3] && granted.missingRoles.isEmpty && granted.warning == nil, "\(granted)")
            #expect(try await Migrator.missingRoles(superuser, names: ["siwa_worker", "no_such_role"]) == ["no_such_role"])
        } catch {
            await cluster.destroy()
            throw error
        }
        await cluster.destroy()
    }

    @Test func aFailingFunctionFileAppliesNothingOfItsRelease() async throws {
        try await withEmptyDatabase { url in
            let connection = try await PostgresConnection.connect(to: url, logger: TestDatabase.logger)
            defer { connection.close() }
            try await Migrator(logger: TestDatabase.logger).migrate(connection)
            var broken = FunctionDefinitions.embedded
            broken[0].sql += "\nCOMMENT ON FUNCTION siwa.record_change(text, text, text, text, text, bigint) IS 'half';\n"
            broken.append(FunctionDefinitions(name: "zz_broken", sql: "SELECT siwa.no_such_function();"))
            await #expect(throws: PostgresError.self) {
                try await Migrator(functions: broken, logger: TestDatabase.logger).migrate(connection)
            }
            let recorded = try await connection.query("SELECT count(*) AS n FROM siwa.schema_functions WHERE name = 'zz_broken'")
            #expect(try recorded[0].decode(Int.self, column: "n") == 0)
            let comment = try await connection.query(
                "SELECT obj_description('siwa.record_change(text, text, text, text, text, bigint)'::regprocedure) AS c")
            #expect(try comment[0].decode(String?.self, column: "c") == nil)
        }
    }

    /// A database written by the last release (numbered migrations 001-004, no function files)
    /// upgrades in place: the functions are replaced by this release's, their privileges and
    /// SECURITY DEFINER kept, and the work it had queued still runs.
    @Test func upgradeFromTheLastReleaseKeepsPrivilegesAndQueuedWork() async throws {
        try await withEmptyDatabase { url in
            let connection = try await PostgresConnection.connect(to: url, logger: TestDatabase.logger)
            defer { connection.close() }
            let lastRelease = Migration.embedded.filter { $0.version <= 4 }
            try await Migrator(migrations: lastRelease, functions: [], logger: TestDatabase.logger).migrate(connection)
            try await connection.simpleQuery(
                """
                INSERT INTO siwa.notifications (jti, client_id, sub, event_type, event_time, claims, jws)
                VALUES ('upgrade-1', 'com.example.app', 'upgrade-sub', 'consent-revoked', now(), '{}', 'x.y.z');
                SELECT siwa.request_deletion('com.example.app', 'upgrade-deleting');
                """)

            let upgrade = try await Migrator(logger: TestDatabase.logger).migrate(connection)
            #expect(upgrade.versions == Migration.embedded.map(\.version).filter { $0 > 4 })
            #expect(upgrade.functionFiles == FunctionDefinitions.embedded.map(\.name).sorted())

            let definer = try await connection.query(
                """
                SELECT bool_and(p.prosecdef) AS definer,
                       bool_and(has_function_privilege('siwa_app', p.oid, 'EXECUTE')) AS app_may
                  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                 WHERE n.nspname = 'siwa' AND p.proname IN ('link_account', 'request_deletion')
                """)
            #expect(try definer[0].decode(Bool.self, column: "definer"))
            #expect(try definer[0].decode(Bool.self, column: "app_may"))

            // The notification the old release stored is applied by this release's batch function.
            _ = try await connection.query("SELECT * FROM siwa.run_notification_batch('upgrade-test', 10, 60, false, 1, 3600)")
            let account = try await connection.query(
                "SELECT status FROM siwa.accounts WHERE client_id = 'com.example.app' AND sub = 'upgrade-sub'")
            #expect(try account.first?.decode(String.self, column: "status") == "consent_revoked")
            let revoke = try await connection.query(
                "SELECT count(*) AS n FROM siwa.jobs WHERE kind = 'revoke' AND sub = 'upgrade-deleting' AND state = 'available'")
            #expect(try revoke[0].decode(Int.self, column: "n") == 1)
        }
    }
}
