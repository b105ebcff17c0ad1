import Foundation
import Postgres
import SiwaModel

/// Everything that happened to one account, newest first: Apple's notifications (for its client ID
/// or any of its app group), the changes applied, the jobs run for it with each failed attempt,
/// and the webhook deliveries of its changes with their answers. No job's arguments are read (an
/// exchange's carry the authorization code), nor a notification's token or claims.
struct AccountTimeline: Sendable {
    struct Notification: Sendable {
        var clientID: String
        var eventType: String
        var eventTime: Date
        var receivedAt: Date
        var processedAt: Date?
        var outcome: String?
    }

    struct Change: Sendable {
        var id: Int64
        var change: String
        var status: AccountStatus?
        var reason: String?
        var jobID: Int64?
        var createdAt: Date
    }

    struct Attempt: Sendable {
        var attempt: Int?
        var at: Date?
        var error: String
    }

    struct Job: Sendable {
        var id: Int64
        var kind: String
        var state: String
        var attempt: Int
        var outcome: String?
        var createdAt: Date
        var runAt: Date
        var finalizedAt: Date?
        /// Seconds until `run_at` (negative: due).
        var runsInSeconds: Double
        /// A webhook delivery's change.
        var changeID: Int64?
        /// Failed attempts, oldest first.
        var attempts: [Attempt]

        /// When it last did something: finished, failed, or was queued.
        var lastActivity: Date { finalizedAt ?? attempts.last?.at ?? createdAt }
    }

    enum Entry: Sendable {
        case notification(Notification)
        case change(Change)
        case job(Job)

        var time: Date {
            switch self {
            case .notification(let notification): notification.receivedAt
            case .change(let change): change.createdAt
            case .job(let job): job.lastActivity
            }
        }
    }

    static let limit = 300

    var notifications: [Notification]
    var changes: [Change]
    var jobs: [Job]

    /// Every entry, newest first (changes and jobs of the same instant by id).
    var entries: [Entry] {
        let all = notifications.map(Entry.notification) + changes.map(Entry.change) + jobs.map(Entry.job)
        return all.enumerated().sorted { ($0.element.time, $0.offset) > ($1.element.time, $1.offset) }.map(\.element)
    }

    static func load(clientID: String, sub: String, on connection: PostgresConnection) async throws -> AccountTimeline {
        let notifications = try await connection.query(
            """
            SELECT client_id, event_type, event_time, received_at, processed_at, outcome FROM siwa.notifications
             WHERE sub = \(sub)
               AND (client_id = \(clientID) OR client_id IN (
                      SELECT member.client_id FROM siwa.app_groups own JOIN siwa.app_groups member USING (group_id)
                       WHERE own.client_id = \(clientID)))
             ORDER BY received_at DESC LIMIT \(limit)
            """
        ).map { row in
            Notification(
                clientID: try row.decode(String.self, column: "client_id"), eventType: try row.decode(String.self, column: "event_type"),
                eventTime: try row.decode(Date.self, column: "event_time"), receivedAt: try row.decode(Date.self, column: "received_at"),
                processedAt: try row.decode(Date?.self, column: "processed_at"), outcome: try row.decode(String?.self, column: "outcome"))
        }
        let changes = try await connection.query(
            """
            SELECT id, change, status, reason, job_id, created_at FROM siwa.account_changes
             WHERE client_id = \(clientID) AND sub = \(sub) ORDER BY id DESC LIMIT \(limit)
            """
        ).map { row in
            Change(
                id: try row.decode(Int64.self, column: "id"), change: try row.decode(String.self, column: "change"),
                status: try row.decode(AccountStatus?.self, column: "status"), reason: try row.decode(String?.self, column: "reason"),
                jobID: try row.decode(Int64?.self, column: "job_id"), createdAt: try row.decode(Date.self, column: "created_at"))
        }
        let attempts = try await failedAttempts(clientID: clientID, sub: sub, on: connection)
        let jobs = try await connection.query(
            """
            SELECT id, kind, state, attempt, outcome, created_at, run_at, finalized_at,
                   extract(epoch FROM run_at - now())::float8 AS runs_in,
                   CASE WHEN kind = 'webhook' THEN (args ->> 'change_id')::bigint END AS change_id
              FROM siwa.jobs WHERE client_id = \(clientID) AND sub = \(sub) ORDER BY id DESC LIMIT \(limit)
            """
        ).map { row in
            let id = try row.decode(Int64.self, column: "id")
            return Job(
                id: id, kind: try row.decode(String.self, column: "kind"), state: try row.decode(String.self, column: "state"),
                attempt: try row.decode(Int.self, column: "attempt"), outcome: try row.decode(String?.self, column: "outcome"),
                createdAt: try row.decode(Date.self, column: "created_at"), runAt: try row.decode(Date.self, column: "run_at"),
                finalizedAt: try row.decode(Date?.self, column: "finalized_at"),
                runsInSeconds: try row.decode(Double?.self, column: "runs_in") ?? 0,
                changeID: try row.decode(Int64?.self, column: "change_id"), attempts: attempts[id] ?? [])
        }
        return AccountTimeline(notifications: notifications, changes: changes, jobs: jobs)
    }

    /// Each job's failed attempts, oldest first: of one account's jobs, or of the job `jobID`.
    static func failedAttempts(
        jobID: Int64? = nil, clientID: String? = nil, sub: String? = nil, on connection: PostgresConnection
    ) async throws -> [Int64: [Attempt]] {
        var attempts: [Int64: [Attempt]] = [:]
        for row in try await connection.query(
            """
            SELECT j.id, (e.value ->> 'attempt')::integer AS attempt, (e.value ->> 'at')::timestamptz AS at,
                   coalesce(e.value ->> 'error', 'unknown') AS error
              FROM siwa.jobs j, jsonb_array_elements(j.errors) WITH ORDINALITY AS e(value, n)
             WHERE (\(jobID)::bigint IS NULL OR j.id = \(jobID)::bigint)
               AND (\(clientID)::text IS NULL OR (j.client_id = \(clientID)::text AND j.sub = \(sub)::text))
               AND jsonb_typeof(e.value) = 'object'
             ORDER BY j.id, e.n
            """)
        {
            attempts[try row.decode(Int64.self, column: "id"), default: []].append(
                Attempt(
                    attempt: try row.decode(Int?.self, column: "attempt"), at: try row.decode(Date?.self, column: "at"),
                    error: try row.decode(String.self, column: "error")))
        }
        return attempts
    }
}
