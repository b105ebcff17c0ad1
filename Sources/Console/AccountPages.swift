import Accounts
import Foundation
import SiwaModel

/// `/accounts?q=` (find an account by `sub` or `app_user_id`) and `/accounts/{client_id}/{sub}`
/// (one account, where it stands, and its timeline).
enum AccountPages {
    static func search(_ query: String?, results: [AccountRecord], context: Layout.Context) -> HTML {
        var body: HTML = """
            <form method="get" action="/accounts"><input type="search" name="q" value="\(query)" placeholder="sub or app_user_id" \
            aria-label="sub or app_user_id"> <button type="submit">Find</button></form>
            """
        if let query {
            body += "<h2>Accounts whose sub or app_user_id is “\(query)”</h2>"
            body += Layout.table(["client ID", "sub", "app_user_id", "status", "last change"], results.map { account in
                [
                    "\(account.clientID)",
                    "<a class=\"mono\" href=\"\(URLPart.account(clientID: account.clientID, sub: account.sub))\">\(account.sub)</a>",
                    "<span class=\"mono\">\(account.appUserID)</span>", status(account.status), "\(Ages.timestamp(account.updatedAt))",
                ]
            }, empty: "No account has that sub or app_user_id.")
        }
        return Layout.page("Accounts", section: "Accounts", context: context, body)
    }

    static func account(
        _ account: AccountRecord, timeline: AccountTimeline, standing: AccountStanding, context: Layout.Context
    ) -> HTML {
        let stuck = account.status == .pendingDeletion
            && timeline.jobs.contains { $0.kind == "revoke" && (!$0.attempts.isEmpty || $0.state == "discarded") }
        let email: HTML = account.email.map { email in
            "\(email)" + (account.isPrivateEmail == true ? " <span class=\"tag\">private relay</span>" : "")
        } ?? Layout.none
        let tokens = (account.hasRefreshToken ? "one held" : "none held")
            + (account.retiredTokens > 0 ? ", \(account.retiredTokens) earlier kept for a deletion to revoke" : "")
        let body: HTML = """
            <p class="standing\(stuck ? " bad" : "")" id="standing">\(standing.sentence).</p>
            <dl class="account">
            <dt>client ID</dt><dd>\(account.clientID)</dd>
            <dt>sub</dt><dd class="mono">\(account.sub)</dd>
            <dt>app_user_id</dt><dd class="mono">\(account.appUserID.map { "\($0)" } ?? Layout.none)</dd>
            <dt>status</dt><dd>\(status(account.status))</dd>
            <dt>email</dt><dd>\(email)</dd>
            <dt>email forwarding</dt><dd>\(account.emailForwarding.map { "\($0)" } ?? Layout.none)</dd>
            <dt>refresh token</dt><dd>\(tokens)</dd>
            <dt>linked</dt><dd>\(account.linkedAt.map { "\(Ages.timestamp($0))" } ?? Layout.none)</dd>
            <dt>sessions revoked</dt><dd>\(account.sessionsRevokedAt.map { "\(Ages.timestamp($0))" } ?? Layout.none)</dd>
            <dt>updated</dt><dd>\(Ages.timestamp(account.updatedAt))</dd>
            </dl>
            <p><a href="\(URLPart.path("/jobs", query: [("sub", account.sub)]))">this sub's jobs</a></p>
            <h2>Timeline, newest first</h2>
            <ol class="timeline">\(timeline.entries.map { entry(for: $0, context: context) })</ol>
            """
        return Layout.page("Account", section: "Accounts", context: context, body)
    }

    private static func entry(for entry: AccountTimeline.Entry, context: Layout.Context) -> HTML {
        switch entry {
        case .notification(let notification):
            let outcome: HTML = notification.outcome.map { "outcome <strong>\($0)</strong>" } ?? "<span class=\"state-available\">not processed yet</span>"
            return """
                <li class="notification"><span class="when">\(Ages.timestamp(notification.receivedAt))</span>\
                <span class="tag">notification</span><strong>\(notification.eventType)</strong> from Apple \
                (\(notification.clientID), event time \(Ages.timestamp(notification.eventTime))): \(outcome)</li>

                """
        case .change(let change):
            let reason: HTML = change.reason.map { ", reason <strong>\($0)</strong>" + Self.explain(reason: $0) } ?? ""
            let job: HTML = change.jobID.map { ", by job " + JobPage.link($0) } ?? ""
            return """
                <li class="change"><span class="when">\(Ages.timestamp(change.createdAt))</span><span class="tag">change #\(change.id)</span>\
                <strong>\(change.change)</strong>\(change.status.map { " → \($0.rawValue)" } ?? "")\(reason)\(job)</li>

                """
        case .job(let job):
            let isWebhook = job.kind == "webhook"
            let title: HTML = isWebhook
                ? "webhook delivery\(job.changeID.map { " of change #\($0)" } ?? "") (job " + JobPage.link(job.id) + ")"
                : "\(job.kind) job " + JobPage.link(job.id)
            var result: HTML = "<span class=\"state-\(job.state)\">\(job.state)</span>"
            if let outcome = job.outcome { result += ": \(isWebhook ? "answered " + outcome.replacingOccurrences(of: "delivered ", with: "") : outcome)" }
            if job.state == "available" { result += job.runsInSeconds > 0 ? ", next try in \(Ages.span(job.runsInSeconds))" : ", due now" }
            let attempts: HTML = job.attempts.isEmpty ? "" : """
                <ul class="attempts">\(job.attempts.reversed().map { attempt in
                    "<li><span class=\"when\">\(attempt.at.map { "\(Ages.timestamp($0))" } ?? Layout.none)</span>attempt \(attempt.attempt.map(String.init) ?? "?"): \(isWebhook ? attempt.error : "\(attempt.error) (\(AccountStanding.describe(attempt.error)))")</li>"
                })</ul>
                """
            return """
                <li class="\(isWebhook ? "webhook" : "job")"><span class="when">\(Ages.timestamp(job.lastActivity))</span>\
                <span class="tag">\(isWebhook ? "webhook" : "job")</span><strong>\(title)</strong>: \(result) \
                <span class="muted">(queued \(Ages.timestamp(job.createdAt)), \(job.attempt) attempt\(job.attempt == 1 ? "" : "s"))</span>\(attempts)</li>

                """
        }
    }

    /// What a change's reason means, for the reasons that do not say it themselves.
    static func explain(reason: String) -> HTML {
        switch reason {
        case "sign_in_code_exchanged": " (an app API sign-in; its authorization code exchanged at Apple, the token stored)"
        case "sign_in": " (an app API sign-in with an identity token only; no code exchanged)"
        default: ""
        }
    }

    static func status(_ status: AccountStatus) -> HTML {
        let tone = switch status {
        case .active: "state-completed"
        case .pendingDeletion: "state-available"
        case .consentRevoked, .appleAccountDeleted, .deleted: "muted"
        }
        return "<span class=\"\(tone)\">\(status.rawValue)</span>"
    }
}
