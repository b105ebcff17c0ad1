import Foundation
import JobQueue
import Postgres
import Webhooks

/// What the overview page shows, read in one snapshot (a read-only REPEATABLE READ transaction):
/// the same figures `siwa status` reads, from the same queries where they exist.
struct Overview: Sendable {
    struct KindWaiting: Sendable {
        var ready: Int
        var oldestReadySeconds: Double?
    }

    struct PendingDeletion: Sendable {
        var clientID: String
        var sub: String
        var seconds: Double
    }

    struct PausedClient: Sendable {
        var clientID: String
        var reason: String
        var pausedSeconds: Double
        var nextProbeSeconds: Double
    }

    /// One hour of the last 24: notifications received and deliveries rejected.
    struct Hour: Sendable {
        var start: Date
        var received: Int
        var rejected: Int
    }

    var jobs: [String: [String: Int]]
    var waiting: [String: KindWaiting]
    var pendingDeletionCount: Int
    /// The oldest pending deletions, oldest first (at most `listedDeletions`).
    var pendingDeletions: [PendingDeletion]
    /// Every pending deletion's age, for the chart.
    var deletionAges: [Double]
    var pausedClients: [PausedClient]
    var webhookRegistration: WebhookQueue.Registration?
    var webhookBacklog: WebhookQueue.Backlog
    var outcomesLastHour: [(outcome: String, count: Int)]
    var rejectionsLastHour: [(reason: String, count: Int)]
    var hours: [Hour]
    /// What `siwa status` adds: replication, the change feed's holdback, jobs discarded because
    /// their process died (and the deletions whose revoke is one of them).
    var replication: ReplicationStatus
    var changeFeedHoldback: ChangeFeedHoldback?
    var processDiedJobs: Int
    var processDiedRevokes: Int
    /// When the snapshot was read (the database's clock).
    var readAt: Date

    static let listedDeletions = 20

    static func load(_ connection: PostgresConnection) async throws -> Overview {
        try await connection.simpleQuery("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        do {
            let overview = try await read(connection)
            try await connection.simpleQuery("COMMIT")
            return overview
        } catch {
            try? await connection.simpleQuery("ROLLBACK")
            throw error
        }
    }

    private static func read(_ connection: PostgresConnection) async throws -> Overview {
        let jobs = try await JobQueue.countsByKindAndState(on: connection)
        var waiting: [String: KindWaiting] = [:]
        for row in try await connection.query(
            """
            SELECT kind, count(*) AS ready, extract(epoch FROM now() - min(run_at))::float8 AS oldest
              FROM siwa.jobs WHERE state = 'available' AND run_at <= now() GROUP BY kind
            """)
        {
            waiting[try row.decode(String.self, column: "kind")] = KindWaiting(
                ready: try row.decode(Int.self, column: "ready"), oldestReadySeconds: try row.decode(Double?.self, column: "oldest"))
        }
        // Oldest first; a deletion is as old as its revoke job (the function says why).
        let deletions = try await connection.query("SELECT client_id, sub, age_seconds FROM siwa.pending_deletions()").map { row in
            PendingDeletion(
                clientID: try row.decode(String.self, column: "client_id"), sub: try row.decode(String.self, column: "sub"),
                seconds: try row.decode(Double.self, column: "age_seconds"))
        }
        let paused = try await connection.query(
            """
            SELECT client_id, reason, extract(epoch FROM now() - paused_at)::float8 AS paused,
                   extract(epoch FROM next_probe_at - now())::float8 AS next_probe
              FROM siwa.paused_clients ORDER BY client_id
            """
        ).map { row in
            PausedClient(
                clientID: try row.decode(String.self, column: "client_id"), reason: try row.decode(String.self, column: "reason"),
                pausedSeconds: try row.decode(Double.self, column: "paused"),
                nextProbeSeconds: try row.decode(Double.self, column: "next_probe"))
        }
        let outcomes = try await connection.query(
            """
            SELECT coalesce(outcome, 'not processed yet') AS outcome, count(*) AS n FROM siwa.notifications
             WHERE received_at > now() - interval '1 hour' GROUP BY 1 ORDER BY n DESC, outcome
            """
        ).map { (outcome: try $0.decode(String.self, column: "outcome"), count: try $0.decode(Int.self, column: "n")) }
        let rejections = try await connection.query(
            """
            SELECT reason, sum(count)::bigint AS n FROM siwa.rejections
             WHERE minute > now() - interval '1 hour' GROUP BY reason ORDER BY n DESC, reason
            """
        ).map { (reason: try $0.decode(String.self, column: "reason"), count: try $0.decode(Int.self, column: "n")) }
        let hours = try await connection.query(
            """
            SELECT h.start,
                   (SELECT count(*) FROM siwa.notifications n
                     WHERE n.received_at >= h.start AND n.received_at < h.start + interval '1 hour') AS received,
                   (SELECT coalesce(sum(r.count), 0)::bigint FROM siwa.rejections r
                     WHERE r.minute >= h.start AND r.minute < h.start + interval '1 hour') AS rejected
              FROM generate_series(date_trunc('hour', now()) - interval '23 hours', date_trunc('hour', now()),
                                   interval '1 hour') AS h(start)
             ORDER BY h.start
            """
        ).map { row in
            Hour(
                start: try row.decode(Date.self, column: "start"), received: try row.decode(Int.self, column: "received"),
                rejected: try row.decode(Int.self, column: "rejected"))
        }
        let processDiedRevokes = try await connection.query("SELECT process_died_revokes FROM siwa.deletion_backlog()")[0]
            .decode(Int.self, column: "process_died_revokes")
        return Overview(
            jobs: jobs, waiting: waiting, pendingDeletionCount: deletions.count,
            pendingDeletions: Array(deletions.prefix(listedDeletions)), deletionAges: deletions.map(\.seconds),
            pausedClients: paused, webhookRegistration: try await WebhookQueue.registration(on: connection),
            webhookBacklog: try await WebhookQueue.backlog(on: connection), outcomesLastHour: outcomes,
            rejectionsLastHour: rejections, hours: hours, replication: try await ReplicationStatus.load(connection),
            changeFeedHoldback: try await ChangeFeedHoldback.load(connection),
            processDiedJobs: try await JobQueue.processDied(on: connection), processDiedRevokes: processDiedRevokes,
            readAt: try await connection.query("SELECT now() AS now")[0].decode(Date.self, column: "now"))
    }
}
