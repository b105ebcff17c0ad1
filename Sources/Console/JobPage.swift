import Foundation
import JobQueue
import Postgres

/// One job as `/jobs/{id}` shows it: its row (never its arguments: an exchange's carry the
/// authorization code) and each failed attempt.
struct JobDetail: Sendable {
    var row: JobAdministration.Row
    var attempts: [AccountTimeline.Attempt]

    static func load(_ id: Int64, on connection: PostgresConnection) async throws -> JobDetail? {
        guard let row = try await JobAdministration(connection: connection).job(id) else { return nil }
        let attempts = try await AccountTimeline.failedAttempts(jobID: id, on: connection)[id] ?? []
        return JobDetail(row: row, attempts: attempts)
    }
}

/// `/jobs/{id}`: what the job is for, where it stands, each attempt's time and error, and the
/// actions the jobs list offers for it.
enum JobPage {
    static func render(_ detail: JobDetail, context: Layout.Context) -> HTML {
        let row = detail.row
        let account = URLPart.account(clientID: row.clientID, sub: row.sub)
        let attempts = row.maxAttempts >= Int(Int32.max) ? "\(row.attempt) (no limit)" : "\(row.attempt) of \(row.maxAttempts)"
        let actions = JobsPage.actions(row, context: context)
        var body: HTML = """
            <dl class="account">
            <dt>kind</dt><dd>\(row.kind)</dd>
            <dt>account</dt><dd><a href="\(account)">\(row.clientID) <span class="mono">\(row.sub)</span></a>\
            \(row.guardsPendingDeletion ? " <span class=\"tag\">pending deletion</span>" : "")</dd>
            <dt>state</dt><dd><span class="state-\(row.state)">\(row.state)</span>\(row.outcome.map { ": \($0)" } ?? "")</dd>
            <dt>attempts</dt><dd>\(attempts)</dd>
            <dt>queued</dt><dd>\(Ages.timestamp(row.createdAt))</dd>
            <dt>runs at</dt><dd>\(Ages.timestamp(row.runAt))</dd>
            <dt>finished</dt><dd>\(row.finalizedAt.map { "\(Ages.timestamp($0))" } ?? Layout.none)</dd>
            <dt>actions</dt><dd>\(actions.text.isEmpty ? Layout.none : actions)</dd>
            </dl>
            <h2>Failed attempts</h2>
            """
        body += Layout.table(["attempt", "at", "error", "what it means"], detail.attempts.reversed().map { attempt in
            [
                attempt.attempt.map { "\($0)" } ?? Layout.none, attempt.at.map { "\(Ages.timestamp($0))" } ?? Layout.none,
                "<span class=\"mono\">\(attempt.error)</span>", "\(row.kind == "webhook" ? "" : AccountStanding.describe(attempt.error))",
            ]
        }, numeric: [0], empty: "None: no attempt of this job has failed.")
        body += "<p><a href=\"\(URLPart.path("/jobs", query: [("sub", row.sub)]))\">this sub's jobs</a> · <a href=\"\(account)\">the account's timeline</a></p>"
        return Layout.page("Job #\(row.id)", section: "Jobs", context: context, body)
    }

    /// A job id as a link to its page.
    static func link(_ id: Int64, _ text: String? = nil) -> HTML {
        "<a href=\"/jobs/\(id)\">\(text ?? "#\(id)")</a>"
    }
}
