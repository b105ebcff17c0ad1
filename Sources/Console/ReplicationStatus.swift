import Foundation
package import Postgres

/// Whether the database `siwa status` and the console's overview talk to has a synchronous standby: with one, a commit (and so
/// a notification answered 200) is on the standby before it returns, and a failover loses nothing;
/// without, the last commits before a crash of the primary can be lost.
package struct ReplicationStatus: Sendable {
    /// `synchronous_standby_names` (empty: commits wait for no standby).
    package var synchronousStandbyNames: String
    /// `synchronous_commit` for this session's role and database (`off` / `local`: no wait either).
    package var synchronousCommit: String
    /// Standbys streaming from this server (`pg_stat_replication` rows).
    package var standbys: Int
    /// Of those, the ones in `sync` or `quorum` state; nil when this role may not see the state
    /// (it needs `pg_read_all_stats` or superuser).
    package var synchronousStandbys: Int?
    /// True on a standby (then the URL reached a read-only server, not the primary).
    package var inRecovery: Bool

    package static func load(_ connection: PostgresConnection) async throws -> ReplicationStatus {
        let row = try await connection.query(
            """
            SELECT current_setting('synchronous_standby_names') AS names,
                   current_setting('synchronous_commit') AS commit_level,
                   pg_is_in_recovery() AS in_recovery,
                   (SELECT count(*) FROM pg_stat_replication) AS standbys,
                   (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')) AS sync_standbys,
                   (SELECT count(*) FROM pg_stat_replication WHERE sync_state IS NULL) AS hidden
            """)[0]
        let hidden = try row.decode(Int.self, column: "hidden")
        return ReplicationStatus(
            synchronousStandbyNames: try row.decode(String.self, column: "names"),
            synchronousCommit: try row.decode(String.self, column: "commit_level"),
            standbys: try row.decode(Int.self, column: "standbys"),
            synchronousStandbys: hidden > 0 ? nil : try row.decode(Int.self, column: "sync_standbys"),
            inRecovery: try row.decode(Bool.self, column: "in_recovery"))
    }

    /// Commits wait for a standby's flush: names are configured, the commit level waits for them, and
    /// one is attached in sync (or its state is hidden from this role, so assume the configuration holds).
    package var hasSynchronousStandby: Bool {
        !synchronousStandbyNames.isEmpty && !["off", "local"].contains(synchronousCommit)
            && (synchronousStandbys ?? 1) > 0
    }

    package var summary: String {
        if inRecovery { return "this server is a standby (read-only): DATABASE_URL should reach the primary" }
        if synchronousStandbyNames.isEmpty && standbys == 0 {
            return "no standby: losing this server loses the database (see High availability in deploy/README.md)"
        }
        if synchronousStandbyNames.isEmpty {
            return "asynchronous (\(standbys) streaming standbys): a failover can lose the last commits answered 200; set synchronous_standby_names"
        }
        if ["off", "local"].contains(synchronousCommit) {
            return "synchronous_commit = \(synchronousCommit): commits do not wait for the standby; a failover can lose them"
        }
        guard let synchronousStandbys else {
            return "synchronous (synchronous_standby_names = \(synchronousStandbyNames); standby state not visible to this role)"
        }
        if synchronousStandbys == 0 {
            return "no synchronous standby attached (synchronous_standby_names = \(synchronousStandbyNames)): commits wait until one is"
        }
        return "synchronous (\(synchronousStandbys) of \(standbys) streaming standbys in sync; synchronous_standby_names = \(synchronousStandbyNames))"
    }

    package var jsonObject: [String: Any] {
        [
            "synchronous_standby": hasSynchronousStandby,
            "synchronous_standby_names": synchronousStandbyNames,
            "synchronous_commit": synchronousCommit,
            "standbys": standbys,
            "synchronous_standbys": synchronousStandbys.map { $0 as Any } ?? NSNull(),
            "in_recovery": inRecovery,
        ]
    }
}
