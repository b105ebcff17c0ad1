package import Logging
package import Postgres

/// `SIWA_APP_GROUPS` in `siwa.app_groups`, where the notification effects read it
/// (sql/functions/notifications.sql). Written by every worker at start; the groups of the last
/// worker started win, so every worker of a deployment should carry the same setting.
package enum AppGroups {
    /// Replaces the table's content with `groups` (each group's first client ID names it), in one
    /// call (`siwa.store_app_groups`, sql/functions/app_groups.sql: serialized against other workers
    /// starting at once).
    package static func store(_ groups: [[String]], on pool: PostgresPool) async throws {
        let members = groups.flatMap { $0 }
        let names = groups.flatMap { group in group.map { _ in group[0] } }
        _ = try await pool.withConnection { connection in
            try await connection.query("SELECT siwa.store_app_groups(\(members)::text[], \(names)::text[])")
        }
    }

    /// One attempt; false (and a warning) when the database refused it.
    package static func storeOnce(_ groups: [[String]], on pool: PostgresPool, logger: Logger) async -> Bool {
        do {
            try await store(groups, on: pool)
            return true
        } catch {
            logger.warning("could not store SIWA_APP_GROUPS yet; retrying", metadata: ["error": "\(error)"])
            return false
        }
    }

    /// Retries every five seconds until stored or cancelled.
    package static func storeUntilDone(_ groups: [[String]], on pool: PostgresPool, logger: Logger) async {
        while !Task.isCancelled {
            try? await Task.sleep(for: .seconds(5))
            if await storeOnce(groups, on: pool, logger: logger) {
                logger.info("SIWA_APP_GROUPS stored", metadata: ["groups": .int(groups.count)])
                return
            }
        }
    }
}
