import Foundation
import Logging
import Postgres

/// `siwa dev`'s running account of what happens: one line per notification stored and per account
/// change (a sign-in's link included), read from the tables every half second, so a newcomer sees
/// each step of a tour land without opening psql.
struct DevActivity {
    var databaseURL: String
    var output: DevOutput
    var logger: Logger

    /// Until cancelled. A lost connection is opened again on the next round.
    func run() async {
        var connection: PostgresConnection?
        var lastChange: Int64?
        var lastNotification: Date?
        while !Task.isCancelled {
            do {
                if connection == nil {
                    connection = try await PostgresConnection.connect(to: databaseURL, applicationName: "siwa-dev-activity", logger: logger)
                }
                guard let db = connection else { continue }
                if lastChange == nil {
                    // Only what happens from now on.
                    let start = try await db.query("SELECT coalesce(max(id), 0) AS id, now() AS at FROM siwa.account_changes")
                    lastChange = try start[0].decode(Int64.self, column: "id")
                    lastNotification = try start[0].decode(Date.self, column: "at")
                }
                try await report(db, afterChange: &lastChange, afterNotification: &lastNotification)
            } catch {
                connection?.close()
                connection = nil
            }
            try? await Task.sleep(for: .milliseconds(500))
        }
        connection?.close()
    }

    private func report(_ db: PostgresConnection, afterChange: inout Int64?, afterNotification: inout Date?) async throws {
        let since = afterNotification ?? Date()
        let notifications = try await db.query(
            """
            SELECT event_type, client_id, sub, received_at FROM siwa.notifications
             WHERE received_at > \(since) ORDER BY received_at LIMIT 200
            """)
        for row in notifications {
            let type = try row.decode(String.self, column: "event_type")
            let clientID = try row.decode(String.self, column: "client_id")
            let sub = try row.decode(String.self, column: "sub")
            output.line("[activity] notification \(type) for \(clientID) \(sub)")
            afterNotification = try row.decode(Date.self, column: "received_at")
        }
        let changes = try await db.query(
            """
            SELECT id, change, client_id, sub, status FROM siwa.account_changes
             WHERE id > \(afterChange ?? 0) ORDER BY id LIMIT 200
            """)
        for row in changes {
            let change = try row.decode(String.self, column: "change")
            let clientID = try row.decode(String.self, column: "client_id")
            let sub = try row.decode(String.self, column: "sub")
            let status = try row.decode(String?.self, column: "status")
            output.line("[activity] change \(change) for \(clientID) \(sub)\(status.map { " (now \($0))" } ?? "")")
            afterChange = try row.decode(Int64.self, column: "id")
        }
    }
}
