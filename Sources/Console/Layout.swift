import Foundation

/// The frame every page shares, and the one style sheet (served from `/console.css`, so the
/// Content-Security-Policy needs no inline style).
enum Layout {
    /// What a page needs of the browser's session.
    struct Context: Sendable {
        /// The anti-forgery token for the page's forms (nil: the page has no session, so no forms).
        var formToken: String?
        /// The console asks for a token: offer to log out.
        var offersLogout: Bool
        /// When the page's figures were read: every page says so ("as of", UTC).
        var readAt: Date = Date()
        /// A page that reloads itself every `refreshSeconds` (nil: the answer to a POST, which must
        /// not be repeated): the page's own address, and whether the reader paused it.
        var refresh: Refresh?
    }

    struct Refresh: Sendable {
        /// The page's path and query, `refresh` left out.
        var path: String
        var query: [(String, String?)]
        var paused: Bool

        /// The same page with the refresh paused or resumed.
        var toggled: String { URLPart.path(path, query: query + (paused ? [] : [("refresh", "off")])) }
    }

    static let refreshSeconds = 30

    /// How every page shows an empty value.
    static let none: HTML = "<span class=\"muted\">none</span>"

    /// "as of 2026-12-05 10:40:00 UTC · refreshes every 30 s · pause", under each page's title.
    static func freshness(_ context: Context) -> HTML {
        var line: HTML = "as of <time>\(Ages.timestamp(context.readAt))</time>"
        if let refresh = context.refresh {
            line += refresh.paused
                ? " · refresh paused · <a href=\"\(refresh.toggled)\">resume (every \(refreshSeconds) s)</a>"
                : " · refreshes every \(refreshSeconds) s · <a href=\"\(refresh.toggled)\">pause</a>"
        }
        return "<p class=\"asof muted\">\(line)</p>"
    }

    static func page(_ title: String, section: String, context: Context, _ body: HTML) -> HTML {
        let links: [(path: String, name: String)] = [("/", "Overview"), ("/accounts", "Accounts"), ("/jobs", "Jobs")]
        let navigation = HTML.join(links.map { link in
            link.name == section
                ? "<a href=\"\(link.path)\" aria-current=\"page\">\(link.name)</a>"
                : "<a href=\"\(link.path)\">\(link.name)</a>"
        })
        var logout: HTML = ""
        if context.offersLogout, let token = context.formToken {
            logout = """
                <form method="post" action="/logout" class="inline"><input type="hidden" name="csrf" value="\(token)">\
                <button type="submit">Log out</button></form>
                """
        }
        return """
            <!doctype html>
            <html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
            <meta name="referrer" content="no-referrer">\(refreshTag(context))
            <title>\(title) · siwa console</title><link rel="stylesheet" href="/console.css"></head>
            <body><header><strong>siwa console</strong><nav>\(navigation)</nav>
            <form method="get" action="/accounts" class="search"><input type="search" name="q" placeholder="sub or app_user_id" aria-label="sub or app_user_id">\
            <button type="submit">Find</button></form>\(logout)</header>
            <main><h1>\(title)</h1>
            \(freshness(context))
            \(body)</main></body></html>

            """
    }

    /// A meta refresh (allowed by the Content-Security-Policy, which governs fetches, not reloads).
    private static func refreshTag(_ context: Context) -> HTML {
        guard let refresh = context.refresh, !refresh.paused else { return "" }
        return "\n<meta http-equiv=\"refresh\" content=\"\(refreshSeconds)\">"
    }

    /// A table with a header row; `numeric` columns are right-aligned.
    static func table(_ headers: [String], _ rows: [[HTML]], numeric: Set<Int> = [], empty: String = "None.") -> HTML {
        guard !rows.isEmpty else { return "<p class=\"muted\">\(empty)</p>" }
        let head = HTML.join(headers.enumerated().map { index, header in
            numeric.contains(index) ? "<th class=\"num\">\(header)</th>" : "<th>\(header)</th>"
        })
        let body = HTML.join(rows.map { row in
            "<tr>" + HTML.join(row.enumerated().map { index, cell in
                numeric.contains(index) ? "<td class=\"num\">\(cell)</td>" : "<td>\(cell)</td>"
            }) + "</tr>\n"
        })
        return "<table><thead><tr>\(head)</tr></thead><tbody>\(body)</tbody></table>"
    }

    static let styleSheet = """
        :root { color-scheme: light; --ink: #1d2330; --muted: #667085; --line: #d9dee7; --bad: #b42318; --warn: #b54708;
                --good: #067647; --accent: #2e5aac; }
        * { box-sizing: border-box; }
        body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink); background: #f6f7f9; }
        header { display: flex; gap: 1.5em; align-items: center; padding: .6em 1.2em; background: #fff; border-bottom: 1px solid var(--line); flex-wrap: wrap; }
        nav a { margin-right: 1em; color: var(--accent); text-decoration: none; }
        nav a[aria-current] { font-weight: 600; color: var(--ink); }
        form.search { margin-left: auto; display: flex; gap: .4em; }
        form.inline { display: inline; margin: 0; }
        input[type=search], input[type=password] { padding: .3em .5em; border: 1px solid var(--line); border-radius: 4px; min-width: 16em; }
        button { padding: .25em .7em; border: 1px solid var(--line); border-radius: 4px; background: #fff; cursor: pointer; }
        button.danger { color: var(--bad); border-color: #f1b8b3; }
        main { padding: 1em 1.2em 3em; max-width: 1200px; }
        h1 { font-size: 1.35em; margin: .2em 0 .8em; }
        h2 { font-size: 1.05em; margin: 1.6em 0 .5em; }
        section.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(220px, 1fr)); gap: .8em; }
        .card { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: .7em .9em; }
        .card .figure { font-size: 1.6em; font-weight: 600; }
        .card.alert { border-color: #f1b8b3; }
        table { border-collapse: collapse; background: #fff; border: 1px solid var(--line); width: 100%; }
        th, td { text-align: left; padding: .3em .6em; border-bottom: 1px solid var(--line); vertical-align: top; }
        th { background: #eef1f5; font-weight: 600; }
        td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
        code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: .92em; word-break: break-all; }
        .muted { color: var(--muted); }
        .standing { font-size: 1.1em; padding: .7em .9em; background: #fff; border-left: 4px solid var(--accent); margin-bottom: 1em; }
        .standing.bad { border-left-color: var(--bad); }
        .state-discarded, .state-failed { color: var(--bad); font-weight: 600; }
        .state-completed, .state-delivered { color: var(--good); }
        .state-available, .state-running { color: var(--warn); }
        ol.timeline { list-style: none; padding: 0; margin: 0; border-left: 2px solid var(--line); }
        ol.timeline > li { position: relative; margin: 0 0 .7em 1em; padding: .45em .7em; background: #fff; border: 1px solid var(--line); border-radius: 6px; }
        ol.timeline > li::before { content: ""; position: absolute; left: -1.45em; top: .8em; width: .6em; height: .6em; border-radius: 50%; background: var(--accent); }
        ol.timeline > li.job::before { background: var(--warn); }
        ol.timeline > li.webhook::before { background: #7a5af8; }
        ol.timeline > li.notification::before { background: #101828; }
        .when { color: var(--muted); font-size: .9em; margin-right: .6em; font-variant-numeric: tabular-nums; }
        .tag { display: inline-block; font-size: .8em; padding: 0 .45em; border-radius: 3px; background: #eef1f5; margin-right: .4em; }
        ul.attempts { margin: .3em 0 0 1em; padding: 0; font-size: .92em; }
        dl.account { display: grid; grid-template-columns: max-content 1fr; gap: .2em 1em; background: #fff; border: 1px solid var(--line); padding: .7em .9em; border-radius: 6px; }
        dl.account dt { color: var(--muted); }
        dl.account dd { margin: 0; }
        svg { background: #fff; border: 1px solid var(--line); border-radius: 6px; max-width: 100%; height: auto; }
        .filters a { margin-right: .6em; }
        .filters a[aria-current] { font-weight: 600; }
        .notice { padding: .6em .9em; background: #fff; border: 1px solid var(--line); border-left: 4px solid var(--good); }
        .notice.refused { border-left-color: var(--bad); }
        p.asof { margin: -.6em 0 1em; font-size: .9em; }
        """
}
