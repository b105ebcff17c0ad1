import Foundation
import Console
import JobQueue
import Postgres
import Webhooks
import Settings

/// `siwa status [--json]`: the queue, pending deletions, paused client IDs and the last hour's
/// traffic, readable in five seconds. Exit 0, or 1 with one line when the database is unreachable.
enum StatusCommand: CLICommand {
    static let name = "status"
    static let summary = "queue, pending deletions, paused client IDs, last hour's notifications [--json]"

    static func run(_ source: ConfigurationSource) async -> Int32 {
        guard let (url, logger) = CLI.databaseSettings(name, source) else { return 2 }
        guard let connection = await CLI.connect(name, url: url, logger: logger) else { return 1 }
        defer { connection.close() }
        let report: StatusReport
        do {
            report = try await StatusReport.load(connection)
        } catch {
            CLI.error(name, "cannot read the status: \(CLI.oneLine(error))")
            return 1
        }
        print(source.isSet(switch: "json") ? CLI.json(report.jsonObject) : report.text)
        return 0
    }
}

/// What `siwa status` shows, read in one snapshot (a REPEATABLE READ transaction).
struct StatusReport {
    struct PausedClient {
        var clientID: String
        var reason: String
        var pausedAt: Date
        var nextProbeAt: Date
    }

    var generatedAt: Date
    /// jobs[kind][state] = count, every kind and state present.
    var jobs: [String: [String: Int]]
    var readyJobs: Int
    var oldestReadySeconds: Double?
    var pendingDeletions: Int
    var oldestPendingDeletionSeconds: Double?
    var oldestPendingDeletion: (clientID: String, sub: String)?
    var pausedClients: [PausedClient]
    var notificationsLastHour: Int
    var rejectionsLastHour: [String: Int]
    /// The registered webhook endpoint (nil: webhooks off) and the delivery backlog.
    var webhookRegistration: WebhookQueue.Registration?
    var webhookBacklog: WebhookQueue.Backlog
    var replication: ReplicationStatus
    /// The oldest transaction writing account changes, when it has been open long enough to hold
    /// the change feed back (`siwa.account_changes_after` serves nothing past an id it may hold).
    var changeFeedHoldback: ChangeFeedHoldback?

    /// Discarded because their process died running them three times; of those, revokes whose
    /// account is still pending deletion (the deletion waits for `siwa jobs retry`).
    var processDiedJobs: Int
    var processDiedRevokes: Int

    var discardedJobs: Int { jobs.values.reduce(0) { $0 + ($1["discarded"] ?? 0) } }

    static func load(_ connection: PostgresConnection) async throws -> StatusReport {
        try await connection.simpleQuery("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        do {
            let report = try await read(connection)
            try await connection.simpleQuery("COMMIT")
            return report
        } catch {
            try? await connection.simpleQuery("ROLLBACK")
            throw error
        }
    }

    private static func read(_ connection: PostgresConnection) async throws -> StatusReport {
        let jobs = try await JobQueue.countsByKindAndState(on: connection)
        let backlog = try await JobQueue.backlog(on: connection)
        // The deletions still waiting (`siwa.deletion_backlog`, sql/functions/accounts.sql).
        let deletions = try await connection.query(
            """
            SELECT pending, oldest_client_id, oldest_sub, oldest_seconds, process_died_revokes
              FROM siwa.deletion_backlog()
            """)[0]
        let processDiedJobs = try await JobQueue.processDied(on: connection)
        let paused = try await connection.query(
            "SELECT client_id, reason, paused_at, next_probe_at FROM siwa.paused_clients ORDER BY client_id")
        let received = try await connection.query(
            "SELECT count(*) AS n FROM siwa.notifications WHERE received_at > now() - interval '1 hour'")[0]
        var rejections: [String: Int] = [:]
        for row in try await connection.query(
            """
            SELECT reason, sum(count)::bigint AS n FROM siwa.rejections
             WHERE minute > now() - interval '1 hour' GROUP BY reason
            """)
        {
            rejections[try row.decode(String.self, column: "reason")] = try row.decode(Int.self, column: "n")
        }

        let webhookRegistration = try await WebhookQueue.registration(on: connection)
        let webhookBacklog = try await WebhookQueue.backlog(on: connection)

        let oldestDeletion = try deletions.decode(String?.self, column: "oldest_client_id").flatMap { clientID in
            try deletions.decode(String?.self, column: "oldest_sub").map { (clientID: clientID, sub: $0) }
        }
        return StatusReport(
            generatedAt: Date(),
            jobs: jobs,
            readyJobs: backlog.ready,
            oldestReadySeconds: backlog.oldestReadySeconds,
            pendingDeletions: try deletions.decode(Int.self, column: "pending"),
            oldestPendingDeletionSeconds: try deletions.decode(Double?.self, column: "oldest_seconds"),
            oldestPendingDeletion: oldestDeletion,
            pausedClients: try paused.map { row in
                PausedClient(
                    clientID: try row.decode(String.self, column: "client_id"),
                    reason: try row.decode(String.self, column: "reason"),
                    pausedAt: try row.decode(Date.self, column: "paused_at"),
                    nextProbeAt: try row.decode(Date.self, column: "next_probe_at"))
            },
            notificationsLastHour: try received.decode(Int.self, column: "n"),
            rejectionsLastHour: rejections, webhookRegistration: webhookRegistration, webhookBacklog: webhookBacklog,
            replication: try await ReplicationStatus.load(connection),
            changeFeedHoldback: try await ChangeFeedHoldback.load(connection),
            processDiedJobs: processDiedJobs,
            processDiedRevokes: try deletions.decode(Int.self, column: "process_died_revokes"))
    }

    // MARK: Rendering

    var text: String {
        var out = "siwa status at \(CLI.iso8601(generatedAt))\n\n"
        let states = JobAdministration.states
        var rows: [[String]] = [["jobs"] + states + ["total"]]
        var columnTotals = [Int](repeating: 0, count: states.count)
        for kind in JobAdministration.kinds + jobs.keys.filter({ !JobAdministration.kinds.contains($0) }).sorted() {
            let counts = states.map { jobs[kind]?[$0] ?? 0 }
            for (index, count) in counts.enumerated() { columnTotals[index] += count }
            rows.append([kind] + counts.map(String.init) + [String(counts.reduce(0, +))])
        }
        rows.append(["total"] + columnTotals.map(String.init) + [String(columnTotals.reduce(0, +))])
        out += CLI.table(rows, rightAligned: Set(1...states.count + 1)) + "\n\n"

        var facts: [[String]] = []
        facts.append([
            "ready to run",
            readyJobs == 0 ? "0" : "\(readyJobs), oldest waiting \(CLI.age(oldestReadySeconds ?? 0))",
        ])
        var deletion = String(pendingDeletions)
        if let age = oldestPendingDeletionSeconds, let oldest = oldestPendingDeletion {
            deletion += ", oldest \(CLI.age(age)) (\(oldest.clientID) \(oldest.sub))"
        }
        if processDiedRevokes > 0 {
            deletion += "; \(processDiedRevokes) waiting on a revoke discarded as process_died (siwa jobs retry ID)"
        }
        facts.append(["pending deletions", deletion])
        var discarded = discardedJobs == 0 ? "0" : "\(discardedJobs)  (siwa jobs list --state discarded; siwa jobs retry ID)"
        if processDiedJobs > 0 {
            discarded += "; \(processDiedJobs) process_died: the process running each died three times"
        }
        facts.append(["discarded jobs", discarded])
        facts.append(["paused client IDs", pausedClients.isEmpty ? "none" : String(pausedClients.count)])
        let rejected = rejectionsLastHour.values.reduce(0, +)
        facts.append(["received, last hour", String(notificationsLastHour)])
        var rejectedText = String(rejected)
        if rejected > 0 {
            rejectedText +=
                " (" + rejectionsLastHour.sorted { ($1.value, $0.key) < ($0.value, $1.key) }
                .map { "\($0.key) \($0.value)" }.joined(separator: ", ") + ")"
        }
        facts.append(["rejected, last hour", rejectedText])
        facts += webhookFacts
        facts.append(["change feed", changeFeedHoldback?.summary ?? "not held back"])
        facts.append(["replication", replication.summary])
        out += CLI.table(facts)
        for client in pausedClients {
            out +=
                "\n  paused \(client.clientID): \(client.reason) (since \(CLI.iso8601(client.pausedAt)), "
                + "next probe \(CLI.iso8601(client.nextProbeAt)))"
        }
        return out
    }

    /// Webhooks: the endpoint, the backlog and its oldest change, failing and discarded deliveries.
    private var webhookFacts: [[String]] {
        let backlog = webhookBacklog
        var facts: [[String]] = []
        if let registration = webhookRegistration {
            facts.append([
                "webhooks",
                "\(registration.endpoint) (since \(CLI.iso8601(registration.registeredAt)); a worker with the URL seen "
                    + "\(CLI.age(generatedAt.timeIntervalSince(registration.seenAt))) ago)",
            ])
        } else {
            facts.append(["webhooks", "off (no worker has registered SIWA_WEBHOOK_URL; changes are not queued)"])
        }
        guard webhookRegistration != nil || backlog.undelivered + backlog.discarded > 0 else { return facts }
        facts.append([
            "webhook backlog",
            backlog.undelivered == 0
                ? "0" : "\(backlog.undelivered) undelivered, oldest change \(CLI.age(backlog.oldestSeconds ?? 0)) old",
        ])
        var failing = "\(backlog.failing) retrying after a failure"
        if backlog.discarded > 0 {
            failing +=
                "; \(backlog.discarded) discarded, holding back \(backlog.blockedByDiscarded) later change"
                + "\(backlog.blockedByDiscarded == 1 ? "" : "s") (siwa jobs list --kind webhook --state discarded; siwa jobs retry ID)"
        }
        facts.append(["failing deliveries", failing])
        return facts
    }

    /// Stable keys for scripts; ages in seconds (null when there is nothing waiting).
    var jsonObject: [String: Any] {
        var byState = Dictionary(uniqueKeysWithValues: JobAdministration.states.map { ($0, 0) })
        for counts in jobs.values { for (state, count) in counts { byState[state, default: 0] += count } }
        let rejected = rejectionsLastHour.values.reduce(0, +)
        return [
            "generated_at": CLI.iso8601(generatedAt),
            "jobs": [
                "by_state": byState,
                "by_kind": jobs,
                "ready": readyJobs,
                "oldest_ready_seconds": oldestReadySeconds.map { $0 as Any } ?? NSNull(),
                "discarded": discardedJobs,
                "process_died": processDiedJobs,
            ] as [String: Any],
            "pending_deletions": [
                "count": pendingDeletions,
                "oldest_seconds": oldestPendingDeletionSeconds.map { $0 as Any } ?? NSNull(),
                "oldest": oldestPendingDeletion.map { ["client_id": $0.clientID, "sub": $0.sub] as Any } ?? NSNull(),
                "revokes_process_died": processDiedRevokes,
            ] as [String: Any],
            "paused_clients": pausedClients.map {
                [
                    "client_id": $0.clientID, "reason": $0.reason, "paused_at": CLI.iso8601($0.pausedAt),
                    "next_probe_at": CLI.iso8601($0.nextProbeAt),
                ]
            },
            "webhooks": [
                "endpoint": webhookRegistration.map { $0.endpoint as Any } ?? NSNull(),
                "registered_at": webhookRegistration.map { CLI.iso8601($0.registeredAt) as Any } ?? NSNull(),
                "worker_seen_at": webhookRegistration.map { CLI.iso8601($0.seenAt) as Any } ?? NSNull(),
                "undelivered": webhookBacklog.undelivered,
                "oldest_undelivered_seconds": webhookBacklog.oldestSeconds.map { $0 as Any } ?? NSNull(),
                "failing": webhookBacklog.failing,
                "discarded": webhookBacklog.discarded,
                "blocked_by_discarded": webhookBacklog.blockedByDiscarded,
            ] as [String: Any],
            "last_hour": [
                "notifications_received": notificationsLastHour,
                "rejected": rejected,
                "rejected_by_reason": rejectionsLastHour,
            ] as [String: Any],
            "replication": replication.jsonObject,
            "change_feed": [
                "held_back_by_pid": changeFeedHoldback.map { $0.pid.map { $0 as Any } ?? NSNull() } ?? NSNull(),
                "held_back_seconds": changeFeedHoldback?.seconds.map { $0 as Any } ?? NSNull(),
            ] as [String: Any],
        ]
    }
}

extension ChangeFeedHoldback {
    var summary: String {
        let who = pid.map { "pid \($0)" } ?? "a prepared transaction"
        let application = application.flatMap { $0.isEmpty ? nil : ", application \"\($0)\"" } ?? ""
        let open = seconds.map { "open \(CLI.age($0))" }
            ?? "open over \(CLI.age(Self.threshold)) (when it began is hidden from this login: grant it pg_read_all_stats)"
        return "held back by a transaction writing changes, \(open) (\(who)\(application)"
            + (role.map { ", role \($0)" } ?? "") + "): /v1/changes and siwa.account_changes_after serve nothing past it until it ends"
    }
}
