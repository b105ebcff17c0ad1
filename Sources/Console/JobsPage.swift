import JobQueue

/// `/jobs?state=&kind=&sub=`: the queue, newest first, with a retry button on discarded jobs (and
/// on available ones waiting out a backoff) and a cancel button on available and running ones;
/// a pending deletion's revoke has none, as `siwa jobs cancel` refuses it without `--force`.
enum JobsPage {
    static let limit = 200

    static func render(_ rows: [JobAdministration.Row], filter: JobAdministration.Filter, context: Layout.Context, notice: HTML? = nil)
        -> HTML
    {
        func filterLinks(_ name: String, _ values: [String], current: String?) -> HTML {
            let all: [String?] = [nil] + values
            return HTML.join(all.map { value in
                let query: [(String, String?)] = [
                    ("state", name == "state" ? value : filter.state), ("kind", name == "kind" ? value : filter.kind), ("sub", filter.sub),
                ]
                let link = URLPart.path("/jobs", query: query)
                return value == current
                    ? "<a href=\"\(link)\" aria-current=\"true\">\(value ?? "all")</a>" : "<a href=\"\(link)\">\(value ?? "all")</a>"
            })
        }
        let rowsMarkup: [[HTML]] = rows.map { row in
            var note = row.lastError ?? row.outcome ?? ""
            if note.count > 90 { note = String(note.prefix(87)) + "..." }
            return [
                JobPage.link(row.id, "\(row.id)"), "\(row.kind)", "<span class=\"state-\(row.state)\">\(row.state)</span>",
                "<a href=\"\(URLPart.account(clientID: row.clientID, sub: row.sub))\">\(row.clientID) <span class=\"mono\">\(row.sub)</span></a>",
                "\(row.attempt)", "\(row.errorCount)", "\(Ages.timestamp(row.runAt))",
                (row.guardsPendingDeletion ? "<span class=\"tag\">pending deletion</span>" : "") + "\(note)",
                actions(row, context: context),
            ]
        }
        var body: HTML = notice ?? ""
        body += """
            <p class="filters">state: \(filterLinks("state", JobAdministration.states, current: filter.state))</p>
            <p class="filters">kind: \(filterLinks("kind", JobAdministration.kinds, current: filter.kind))</p>
            """
        if let sub = filter.sub { body += "<p>jobs of sub <span class=\"mono\">\(sub)</span> · <a href=\"/jobs\">all subs</a></p>" }
        body += Layout.table(
            ["id", "kind", "state", "account", "attempt", "errors", "run at", "last error / outcome", ""], rowsMarkup, numeric: [0, 4, 5],
            empty: "No job matches.")
        if rows.count == limit { body += "<p class=\"muted\">the newest \(limit); narrow the filters for others</p>" }
        return Layout.page("Jobs", section: "Jobs", context: context, body)
    }

    static func actions(_ row: JobAdministration.Row, context: Layout.Context) -> HTML {
        guard let token = context.formToken else { return "" }
        func button(_ action: String, _ label: String, danger: Bool = false) -> HTML {
            """
            <form method="post" action="/jobs/\(row.id)/\(action)" class="inline"><input type="hidden" name="csrf" value="\(token)">\
            <button type="submit"\(danger ? " class=\"danger\"" : "")>\(label)</button></form>
            """
        }
        var markup: HTML = ""
        if row.state == "discarded" || (row.state == "available" && row.errorCount > 0) {
            markup += button("retry", row.state == "discarded" ? "Retry" : "Retry now")
        }
        if row.state == "available" || row.state == "running" {
            markup += row.guardsPendingDeletion
                ? " <span class=\"muted\" title=\"siwa jobs cancel --force, if you truly mean to drop it\">not cancellable</span>"
                : " " + button("cancel", "Cancel", danger: true)
        }
        return markup
    }

    /// The answer to a retry or cancel: what happened, in one line.
    static func notice(_ text: String, refused: Bool = false) -> HTML {
        "<p class=\"notice\(refused ? " refused" : "")\" role=\"status\">\(text)</p>"
    }
}
