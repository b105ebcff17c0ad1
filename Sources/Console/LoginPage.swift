/// The page a console listening beyond loopback shows first: one of `SIWA_CONSOLE_TOKENS`, asked
/// once, then kept as a session cookie.
enum LoginPage {
    static func render(failed: Bool) -> HTML {
        let problem: HTML = failed ? "<p class=\"notice refused\" role=\"alert\">That token is not one this console accepts.</p>" : ""
        return """
            <!doctype html>
            <html lang="en"><head><meta charset="utf-8"><meta name="referrer" content="no-referrer">
            <title>Log in · siwa console</title><link rel="stylesheet" href="/console.css"></head>
            <body><main><h1>siwa console</h1>\(problem)
            <form method="post" action="/login"><p><label>Console token (one of SIWA_CONSOLE_TOKENS)<br>\
            <input type="password" name="token" autocomplete="current-password" required autofocus></label></p>\
            <p><button type="submit">Log in</button></p></form></main></body></html>

            """
    }
}
