import Foundation
import JobQueue
import Webhooks

/// `/`: is anything stuck? The queue by kind and state, deletions waiting on Apple, paused client
/// IDs, the webhook backlog, and the last hour's traffic, with the last 24 hours drawn.
enum OverviewPage {
    static func render(_ overview: Overview, context: Layout.Context) -> HTML {
        let states = JobAdministration.states
        let kinds = JobAdministration.kinds + overview.jobs.keys.filter { !JobAdministration.kinds.contains($0) }.sorted()
        let jobRows: [[HTML]] = kinds.map { kind in
            let counts = states.map { overview.jobs[kind]?[$0] ?? 0 }
            let waiting = overview.waiting[kind]
            let cells: [HTML] = counts.enumerated().map { index, count in
                count == 0 ? "<span class=\"muted\">0</span>"
                    : "<a href=\"\(URLPart.path("/jobs", query: [("kind", kind), ("state", states[index])]))\">\(count)</a>"
            }
            let oldest: HTML = waiting.map { "\($0.ready), oldest \(Ages.span($0.oldestReadySeconds ?? 0))" } ?? Layout.none
            return ["<a href=\"\(URLPart.path("/jobs", query: [("kind", kind)]))\">\(kind)</a>"] + cells + [oldest]
        }
        let discarded = overview.jobs.values.reduce(0) { $0 + ($1["discarded"] ?? 0) }
        var oldestDeletion = overview.pendingDeletions.first.map { "oldest \(Ages.span($0.seconds))" } ?? "none waiting"
        if overview.processDiedRevokes > 0 {
            oldestDeletion += "; \(overview.processDiedRevokes) waiting on a revoke discarded as process_died (retry it)"
        }
        let discardedNote = (discarded == 0 ? "nothing to retry" : "retry them from Jobs")
            + (overview.processDiedJobs > 0 ? "; \(overview.processDiedJobs) process_died: the process running each died three times" : "")
        let backlog = overview.webhookBacklog
        let received = overview.outcomesLastHour.reduce(0) { $0 + $1.count }
        let rejected = overview.rejectionsLastHour.reduce(0) { $0 + $1.count }

        var body: HTML = """
            <section class="cards">
            \(card("pending deletions", "\(overview.pendingDeletionCount)", oldestDeletion, alert: overview.pendingDeletions.first.map { $0.seconds > 3600 } ?? false))
            \(card("discarded jobs", "\(discarded)", discardedNote, alert: discarded > 0, link: "/jobs?state=discarded"))
            \(card("paused client IDs", "\(overview.pausedClients.count)", overview.pausedClients.isEmpty ? "Apple accepts our credentials" : "Apple refused our credentials", alert: !overview.pausedClients.isEmpty))
            \(card("webhook backlog", "\(backlog.undelivered)", webhookNote(overview), alert: backlog.discarded > 0))
            \(card("notifications, last hour", "\(received)", rejected == 0 ? "none rejected" : "\(rejected) rejected", alert: rejected > 0))
            </section>
            <h2>Workers and database</h2>
            \(health(overview))
            <h2>Last 24 hours</h2>
            \(Charts.hourly(overview.hours))
            <h2>Jobs by kind and state</h2>
            \(Layout.table(["kind"] + states + ["ready now, oldest waiting"], jobRows, numeric: Set(1...states.count)))
            <h2>Pending deletions</h2>
            \(Charts.deletionAges(overview.deletionAges))
            \(Layout.table(["account", "waiting"], overview.pendingDeletions.map { deletion in
                ["<a href=\"\(URLPart.account(clientID: deletion.clientID, sub: deletion.sub))\">\(deletion.clientID) <span class=\"mono\">\(deletion.sub)</span></a>",
                 "\(Ages.span(deletion.seconds))"]
            }, empty: "No deletion is waiting on Apple."))
            """
        if overview.pendingDeletionCount > overview.pendingDeletions.count {
            body += "<p class=\"muted\">the oldest \(overview.pendingDeletions.count) of \(overview.pendingDeletionCount)</p>"
        }
        body += """
            <h2>Paused client IDs</h2>
            \(Layout.table(["client ID", "reason", "paused for", "next probe in"], overview.pausedClients.map { client in
                ["\(client.clientID)", "\(client.reason)", "\(Ages.span(client.pausedSeconds))", "\(Ages.span(max(0, client.nextProbeSeconds)))"]
            }, empty: "None: Apple accepts the credentials of every client ID."))
            <h2>Last hour</h2>
            <h3>Notifications by outcome</h3>
            \(Layout.table(["outcome", "notifications"], overview.outcomesLastHour.map { ["\($0.outcome)", "\($0.count)"] }, numeric: [1], empty: "No notification received."))
            <h3>Notifications rejected by the receiver, by reason</h3>
            \(Layout.table(["reason", "requests rejected"], overview.rejectionsLastHour.map { ["\($0.reason)", "\($0.count)"] }, numeric: [1], empty: "None rejected."))
            """
        return Layout.page("Overview", section: "Overview", context: context, body)
    }

    /// What `siwa status` says beyond the queue: whether a worker is alive (one that sends webhooks
    /// refreshes the registration it last saw), replication, and the change feed.
    private static func health(_ overview: Overview) -> HTML {
        let workers: HTML
        if let registration = overview.webhookRegistration {
            let seen = overview.readAt.timeIntervalSince(registration.seenAt)
            workers = "a worker sending webhooks to <span class=\"mono\">\(registration.endpoint)</span> was last seen "
                + "<strong>\(Ages.span(seen)) ago</strong> (registered \(Ages.timestamp(registration.registeredAt)))"
        } else {
            workers = "not known: no worker has registered SIWA_WEBHOOK_URL (a worker's own /healthz and /readyz say whether it runs)"
        }
        let feed: HTML = overview.changeFeedHoldback.map { holdback in
            let who = holdback.pid.map { "pid \($0)" } ?? "a prepared transaction"
            let open = holdback.seconds.map { "open \(Ages.span($0))" } ?? "open over \(Ages.span(ChangeFeedHoldback.threshold))"
            return "<span class=\"state-discarded\">held back</span> by a transaction writing changes (\(who)"
                + "\(holdback.application.flatMap { $0.isEmpty ? nil : ", application \($0)" } ?? ""), \(open)): "
                + "/v1/changes serves nothing past it until it ends"
        } ?? "not held back"
        let replication = overview.replication
        return """
            <dl class="account">
            <dt>workers</dt><dd>\(workers)</dd>
            <dt>replication</dt><dd class="\(replication.hasSynchronousStandby ? "" : "state-available")">\(replication.summary)</dd>
            <dt>change feed</dt><dd>\(feed)</dd>
            </dl>
            """
    }

    private static func card(_ name: String, _ figure: String, _ note: String, alert: Bool, link: String? = nil) -> HTML {
        let figureMarkup: HTML = link.map { "<a href=\"\($0)\">\(figure)</a>" } ?? "\(figure)"
        return """
            <div class="card\(alert ? " alert" : "")"><div class="muted">\(name)</div><div class="figure">\(figureMarkup)</div>\
            <div class="muted">\(note)</div></div>
            """
    }

    private static func webhookNote(_ overview: Overview) -> String {
        let backlog = overview.webhookBacklog
        guard overview.webhookRegistration != nil || backlog.undelivered + backlog.discarded > 0 else {
            return "webhooks off (no worker has SIWA_WEBHOOK_URL)"
        }
        var note = backlog.undelivered == 0 ? "all delivered" : "oldest \(Ages.span(backlog.oldestSeconds ?? 0))"
        if backlog.failing > 0 { note += ", \(backlog.failing) retrying" }
        if backlog.discarded > 0 { note += ", \(backlog.discarded) discarded" }
        return note
    }
}
