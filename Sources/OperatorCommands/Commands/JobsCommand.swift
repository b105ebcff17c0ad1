import Foundation
import JobQueue
import Postgres
import Settings

/// `siwa jobs list|retry|cancel`: look at the queue and act on single jobs or on one user's jobs.
enum JobsCommand: CLICommand {
    static let name = "jobs"
    static let summary = "list [--state S] [--kind K] [--sub SUB] [--limit N] [--json] | retry ID|--sub SUB | cancel ID|--sub SUB [--force]"

    static func run(_ source: ConfigurationSource) async -> Int32 {
        guard let action = source.positional.first else {
            FileHandle.standardError.write(Data(usage.text().utf8))
            return 2
        }
        switch action {
        case "list": return await list(source)
        case "retry", "cancel": return await act(action, source)
        default:
            CLI.error(name, "unknown action \"\(action)\" (list, retry or cancel)")
            return 2
        }
    }

    // MARK: list

    private static func list(_ source: ConfigurationSource) async -> Int32 {
        guard let (url, logger) = CLI.databaseSettings(name, source, options: ["state", "kind", "sub", "limit"])
        else { return 2 }
        var filter = JobAdministration.Filter()
        filter.state = source.option("state")
        filter.kind = source.option("kind")
        filter.sub = source.option("sub")
        if let state = filter.state, !JobAdministration.states.contains(state) {
            CLI.error(name, "--state: expected one of \(JobAdministration.states.joined(separator: ", ")), got \"\(state)\"")
            return 2
        }
        if let kind = filter.kind, !JobAdministration.kinds.contains(kind) {
            CLI.error(name, "--kind: expected one of \(JobAdministration.kinds.joined(separator: ", ")), got \"\(kind)\"")
            return 2
        }
        if let text = source.option("limit") {
            guard let limit = Int(text), (1...100_000).contains(limit) else {
                CLI.error(name, "--limit: expected a whole number from 1 to 100000, got \"\(text)\"")
                return 2
            }
            filter.limit = limit
        }
        guard source.positional.count == 1 else {
            CLI.error(name, "list takes no arguments (use --state, --kind, --sub, --limit)")
            return 2
        }
        guard let connection = await CLI.connect(name, url: url, logger: logger) else { return 1 }
        defer { connection.close() }
        let rows: [JobAdministration.Row]
        do {
            rows = try await JobAdministration(connection: connection).list(filter)
        } catch {
            CLI.error(name, CLI.oneLine(error))
            return 1
        }
        if source.isSet(switch: "json") {
            print(CLI.json(rows.map(jsonObject)))
            return 0
        }
        if rows.isEmpty {
            print("no jobs match")
            return 0
        }
        var table: [[String]] = [["id", "kind", "state", "client_id", "sub", "attempt", "errors", "run_at", "last error / outcome"]]
        for row in rows {
            var note = row.lastError ?? row.outcome ?? ""
            if note.count > 60 { note = String(note.prefix(57)) + "..." }
            if row.guardsPendingDeletion { note = "pending deletion" + (note.isEmpty ? "" : "; " + note) }
            table.append([
                String(row.id), row.kind, row.state, row.clientID, row.sub, "\(row.attempt)/\(row.maxAttempts >= Int(Int32.max) ? "∞" : String(row.maxAttempts))",
                String(row.errorCount), CLI.iso8601(row.runAt), note,
            ])
        }
        print(CLI.table(table, rightAligned: [0, 6]))
        if rows.count == filter.limit { print("(first \(filter.limit); use --limit N for more)") }
        return 0
    }

    private static func jsonObject(_ row: JobAdministration.Row) -> [String: Any] {
        [
            "id": row.id, "kind": row.kind, "state": row.state, "client_id": row.clientID, "sub": row.sub,
            "attempt": row.attempt, "max_attempts": row.maxAttempts, "error_count": row.errorCount,
            "last_error": row.lastError.map { $0 as Any } ?? NSNull(),
            "outcome": row.outcome.map { $0 as Any } ?? NSNull(),
            "run_at": CLI.iso8601(row.runAt), "created_at": CLI.iso8601(row.createdAt),
            "finalized_at": row.finalizedAt.map { CLI.iso8601($0) as Any } ?? NSNull(),
            "pending_deletion": row.guardsPendingDeletion,
        ]
    }

    // MARK: retry / cancel

    private static func act(_ action: String, _ source: ConfigurationSource) async -> Int32 {
        guard let (url, logger) = CLI.databaseSettings(name, source, options: ["sub", "kind"]) else { return 2 }
        let kind = source.option("kind")
        if let kind, !JobAdministration.kinds.contains(kind) {
            CLI.error(name, "--kind: expected one of \(JobAdministration.kinds.joined(separator: ", ")), got \"\(kind)\"")
            return 2
        }
        let target: JobAdministration.Target
        let arguments = source.positional.dropFirst()
        switch (arguments.first, source.option("sub")) {
        case (let id?, nil) where arguments.count == 1:
            guard let id = Int64(id), id > 0 else {
                CLI.error(name, "\(action): expected a job ID (a positive number), got \"\(id)\"")
                return 2
            }
            target = .id(id)
        case (nil, let sub?):
            target = .sub(sub)
        default:
            CLI.error(name, "\(action): give one job ID or --sub SUB")
            return 2
        }
        if action == "retry" && source.isSet(switch: "force") {
            CLI.error(name, "retry: --force applies to cancel only")
            return 2
        }
        guard let connection = await CLI.connect(name, url: url, logger: logger) else { return 1 }
        defer { connection.close() }
        let administration = JobAdministration(connection: connection)
        do {
            // A job that is not there is a mistake worth saying, not "retried 0 jobs".
            if case .id(let id) = target, try await administration.job(id) == nil {
                CLI.error(name, "\(action): no job #\(id) (siwa jobs list shows the jobs there are)")
                return 1
            }
            if action == "retry" {
                let retried = try await administration.retryReturningKinds(target, kind: kind)
                print("retried \(retried.count) job\(retried.count == 1 ? "" : "s")")
                for job in retried { print("  #\(job.id) \(job.kind)") }
                if retried.isEmpty, case .id = target {
                    print("(only discarded jobs, or available jobs waiting out a retry, can be retried; cancelled ones were stopped on purpose)")
                }
                return 0
            }
            let force = source.isSet(switch: "force")
            let result = try await administration.cancel(target, kind: kind, force: force)
            print("cancelled \(result.cancelled.count) job\(result.cancelled.count == 1 ? "" : "s")")
            for id in result.cancelled { print("  #\(id) \(result.kinds[id] ?? "?")") }
            if result.alreadyFinal > 0 {
                print("\(result.alreadyFinal) already final (completed, discarded or cancelled), left as they were")
            }
            for id in result.cancelledPendingDeletions {
                CLI.warn(
                    "job \(id) was the revoke of a pending deletion: the account stays pending_deletion with no revoke "
                        + "queued. Call siwa.request_deletion(client_id, sub) again to queue a new one.")
            }
            if !result.refused.isEmpty {
                CLI.error(
                    name,
                    "refused to cancel \(result.refused.map { "job #\($0) (revoke)" }.joined(separator: ", ")): revoke of a pending deletion "
                        + "(a deletion must never be dropped silently; add --force if you mean it)")
                return 1
            }
            return 0
        } catch {
            CLI.error(name, CLI.oneLine(error))
            return 1
        }
    }
}
