import Foundation
import Postgres
import Testing

/// `siwa console` over HTTP, as a real process reading with a `siwa_worker` login: each page with
/// known rows, values escaped, no secret shown, and the two actions guarded by the session's
/// anti-forgery token.
@Suite(.serialized) struct ConsoleTests {
    typealias Fixture = ConsoleFixture

    /// Runs `body` with the fixture written and a console started with a worker login.
    static func withConsole(_ body: (ConsoleProcess, Fixture, PostgresConnection) async throws -> Void) async throws {
        try await withMigratedDatabase { database in
            let db = try await database.connect()
            defer { db.close() }
            let fixture = try await Fixture.write(db)
            try await database.withLogin(inRole: "siwa_worker") { url in
                let console = try await ConsoleProcess(databaseURL: url)
                do {
                    try await body(console, fixture, db)
                } catch {
                    print("---- siwa console log ----\n\(console.process.log.suffix(6000))")
                    await console.stop()
                    throw error
                }
                await console.stop()
            }
        }
    }

    /// What every page must be: the security headers, no script, no secret of the fixture's.
    static func expectSafe(_ answer: ConsoleAnswer, _ what: String, sourceLocation: SourceLocation = #_sourceLocation) {
        let policy = answer.header("Content-Security-Policy") ?? ""
        #expect(policy.contains("default-src 'none'") && !policy.contains("unsafe"), "\(what): CSP \(policy)", sourceLocation: sourceLocation)
        #expect(answer.header("X-Content-Type-Options") == "nosniff", "\(what)", sourceLocation: sourceLocation)
        #expect(!answer.body.lowercased().contains("<script"), "\(what) holds a script element", sourceLocation: sourceLocation)
        for secret in Fixture.secrets {
            #expect(!answer.body.contains(secret), "\(what) shows a secret (\(secret.prefix(6))…)", sourceLocation: sourceLocation)
        }
        #expect(!answer.body.contains("eyJ"), "\(what) shows a JWT-looking string", sourceLocation: sourceLocation)
        #expect(!answer.body.contains("src="), "\(what) loads something", sourceLocation: sourceLocation)
    }

    @Test func everyPageShowsTheKnownRowsEscapedAndNoSecret() async throws {
        try await Self.withConsole { console, fixture, _ in
            let overview = try await ConsoleHTTP.get(console.base + "/")
            #expect(overview.status == 200)
            Self.expectSafe(overview, "/")
            #expect(overview.header("Content-Type") == "text/html; charset=utf-8")
            let setCookie = overview.header("Set-Cookie") ?? ""
            #expect(setCookie.contains("HttpOnly") && setCookie.contains("SameSite=Strict"), "\(setCookie)")
            for text in [
                "Jobs by kind and state", "pending deletions", Fixture.pausedClient, "invalid_client", "bad_signature",
                "applied", "not processed yet", "/jobs?kind=exchange&amp;state=discarded",
                "aria-label=\"notifications received and rejected per hour, last 24 hours\"", "aria-label=\"pending deletions by age\"",
                URLPart(Fixture.clientID, Fixture.deletingSub),
            ] {
                #expect(overview.body.contains(text), "overview lacks \(text)")
            }
            #expect(overview.body.components(separatedBy: "<svg").count == 3, "two charts")

            // Find by sub and by app_user_id; both shown escaped.
            for query in [Fixture.scriptSub, Fixture.scriptUser] {
                let found = try await ConsoleHTTP.get(console.base + "/accounts?q=" + Self.encode(query))
                #expect(found.status == 200)
                Self.expectSafe(found, "/accounts?q=")
                #expect(found.body.contains("000111.&lt;script&gt;alert(1)&lt;/script&gt;"), "\(found.body)")
                #expect(found.body.contains("&lt;script&gt;alert(&#39;u&#39;)&lt;/script&gt;&amp;&quot;x&quot;"))
                #expect(found.body.contains("href=\"/accounts/com.example.app/000111.%3Cscript%3Ealert%281%29%3C%2Fscript%3E\""))
            }
            let none = try await ConsoleHTTP.get(console.base + "/accounts?q=nobody")
            #expect(none.body.contains("No account has that sub or app_user_id."))

            // The account with the script sub: its rows, newest first, never the token or code.
            let account = try await ConsoleHTTP.get(console.base + URLPart(Fixture.clientID, Fixture.scriptSub))
            #expect(account.status == 200)
            Self.expectSafe(account, "the script account")
            let page = account.body
            #expect(page.contains("active, linked 2 h ago; a refresh token is held"), "\(page)")
            let order = ["email-disabled", "exchange job <a href=\"/jobs/\(fixture.discardedExchange)\">#\(fixture.discardedExchange)</a>", "email-enabled", "<strong>linked</strong>"]
            let positions = order.map { page.range(of: $0)?.lowerBound }
            #expect(positions.allSatisfy { $0 != nil }, "timeline lacks one of \(order)")
            #expect(positions.compactMap { $0 } == positions.compactMap { $0 }.sorted(), "timeline not newest first")
            #expect(page.contains("attempt 1: http_503 (Apple answered 503)") && page.contains("attempt 2: invalid_grant"))

            // The deletion Apple keeps refusing, in one sentence.
            let deleting = try await ConsoleHTTP.get(console.base + URLPart(Fixture.clientID, Fixture.deletingSub))
            Self.expectSafe(deleting, "the deleting account")
            #expect(deleting.body.contains(#/id="standing">deletion requested \d+ (s|min) ago; revoke failing: Apple answered 503 five times; next try in 3 h\./#),
                    "\(deleting.body)")
            let unknown = try await ConsoleHTTP.get(console.base + URLPart(Fixture.clientID, "000999.none"))
            #expect(unknown.status == 404)

            // Jobs: retry on the discarded one, cancel on the waiting notification, none on the revoke.
            let discarded = try await ConsoleHTTP.get(console.base + "/jobs?state=discarded")
            Self.expectSafe(discarded, "/jobs?state=discarded")
            #expect(discarded.body.contains("action=\"/jobs/\(fixture.discardedExchange)/retry\""))
            let available = try await ConsoleHTTP.get(console.base + "/jobs?state=available")
            Self.expectSafe(available, "/jobs?state=available")
            #expect(available.body.contains("action=\"/jobs/\(fixture.availableNotificationJob)/cancel\""))
            #expect(!available.body.contains("action=\"/jobs/\(fixture.pendingRevoke)/cancel\""))
            #expect(available.body.contains("not cancellable"))
            #expect(!available.body.contains("/jobs/\(fixture.discardedExchange)/"), "filtered by state")
            for state in ["running", "completed", "cancelled"] {
                Self.expectSafe(try await ConsoleHTTP.get(console.base + "/jobs?state=\(state)"), "/jobs?state=\(state)")
            }
            #expect(try await ConsoleHTTP.get(console.base + "/jobs?state=bogus").status == 400)
            #expect(try await ConsoleHTTP.get(console.base + "/nowhere").status == 404)
            let style = try await ConsoleHTTP.get(console.base + "/console.css")
            #expect(style.status == 200 && style.header("Content-Type") == "text/css; charset=utf-8")
        }
    }

    @Test func retryAndCancelNeedTheSessionsFormToken() async throws {
        try await Self.withConsole { console, fixture, db in
            func state(_ id: Int64) async throws -> String {
                try await db.query("SELECT state FROM siwa.jobs WHERE id = \(id)")[0].decode(String.self, at: 0)
            }
            let page = try await ConsoleHTTP.get(console.base + "/jobs")
            let cookie = try #require(page.sessionCookie)
            let token = try #require(page.formToken)
            let other = try await ConsoleHTTP.get(console.base + "/jobs")
            let otherToken = try #require(other.formToken)
            #expect(otherToken != token, "a token per session")

            let retry = console.base + "/jobs/\(fixture.discardedExchange)/retry"
            for (form, cookie, what) in [
                (["csrf": token], nil, "no cookie"), ([:], cookie, "no token"), (["csrf": "forged"], cookie, "a wrong token"),
                (["csrf": otherToken], cookie, "another session's token"),
            ] as [([String: String], String?, String)] {
                let refused = try await ConsoleHTTP.post(retry, form: form, cookie: cookie)
                #expect(refused.status == 403, "\(what): \(refused.status)")
                Self.expectSafe(refused, "403")
                #expect(try await state(fixture.discardedExchange) == "discarded", "\(what) changed nothing")
            }
            let retried = try await ConsoleHTTP.post(retry, form: ["csrf": token], cookie: cookie)
            #expect(retried.status == 200)
            #expect(retried.body.contains("job #\(fixture.discardedExchange) will run again now"))
            #expect(try await state(fixture.discardedExchange) == "available")
            let code = try await db.query("SELECT args ->> 'code' FROM siwa.jobs WHERE id = \(fixture.discardedExchange)")[0]
                .decode(String?.self, at: 0)
            #expect(code == Fixture.code, "the same function as siwa jobs retry: args kept")

            let cancel = console.base + "/jobs/\(fixture.availableNotificationJob)/cancel"
            #expect(try await ConsoleHTTP.post(cancel, form: [:], cookie: cookie).status == 403)
            #expect(try await state(fixture.availableNotificationJob) == "available")
            let cancelled = try await ConsoleHTTP.post(cancel, form: ["csrf": token], cookie: cookie)
            #expect(cancelled.status == 200 && cancelled.body.contains("job #\(fixture.availableNotificationJob) cancelled"))
            #expect(try await state(fixture.availableNotificationJob) == "cancelled")
            let outcome = try await db.query("SELECT outcome FROM siwa.jobs WHERE id = \(fixture.availableNotificationJob)")[0]
                .decode(String?.self, at: 0)
            #expect(outcome == "cancelled_by_operator")

            // A pending deletion's revoke: refused, as siwa jobs cancel refuses it without --force.
            let revoke = try await ConsoleHTTP.post(
                console.base + "/jobs/\(fixture.pendingRevoke)/cancel", form: ["csrf": token], cookie: cookie)
            #expect(revoke.status == 409 && revoke.body.contains("refused to cancel job #\(fixture.pendingRevoke)"))
            #expect(try await state(fixture.pendingRevoke) == "available")
            #expect(try await db.int("SELECT count(*) FROM siwa.account_changes WHERE change = 'deletion_revoke_cancelled'") == 0)

            let logout = try await ConsoleHTTP.post(console.base + "/logout", form: ["csrf": token], cookie: cookie)
            #expect(logout.status == 303)
            #expect(try await ConsoleHTTP.post(retry, form: ["csrf": token], cookie: cookie).status == 403, "a closed session acts no more")
        }
    }

    @Test func aLoopbackConsoleAnswersOnlyToLoopbackNames() async throws {
        try await Self.withConsole { console, _, _ in
            let port = console.base.split(separator: ":").last.map(String.init) ?? ""
            let rebound = try await ConsoleHTTP.get(console.base + "/", host: "attacker.example:\(port)")
            #expect(rebound.status == 421)
            #expect(rebound.header("Content-Security-Policy") != nil)
            #expect(try await ConsoleHTTP.get(console.base + "/", host: "localhost:\(port)").status == 200)
        }
    }

    @Test func anotherAddressNeedsTokensAndALogin() async throws {
        try await withMigratedDatabase { database in
            let environment = ["DATABASE_URL": database.url]
            let missing = try await Siwa.run(["console", "--listen", "0.0.0.0:0"], environment: environment)
            #expect(missing.status == 2 && missing.stderr.contains("SIWA_CONSOLE_TOKENS"), "\(missing.stderr)")
            #expect(missing.stderr.split(separator: "\n").count == 1)
            let short = try await Siwa.run(
                ["console", "--listen", "0.0.0.0:0"], environment: environment.merging(["SIWA_CONSOLE_TOKENS": "short"]) { $1 })
            #expect(short.status == 2 && short.stderr.contains("shorter than 32"), "\(short.stderr)")
            let unknown = try await Siwa.run(["console", "--bogus", "1"], environment: environment)
            #expect(unknown.status == 2 && unknown.stderr.contains("--bogus"))

            let token = "console-token-" + UUID().uuidString  // 50 characters
            let console = try await ConsoleProcess(
                databaseURL: database.url, listen: "0.0.0.0:0", environment: ["SIWA_CONSOLE_TOKENS": "another-token-of-thirty-two-chars-x," + token])
            #expect(console.process.log.contains("log in with one of SIWA_CONSOLE_TOKENS"))
            let first = try await ConsoleHTTP.get(console.base + "/")
            #expect(first.status == 303 && first.header("Location") == "/login")
            #expect(first.header("Content-Security-Policy") != nil)
            let login = try await ConsoleHTTP.get(console.base + "/login")
            #expect(login.status == 200 && login.body.contains("type=\"password\" name=\"token\""))
            #expect(try await ConsoleHTTP.post(console.base + "/jobs/1/retry", form: ["csrf": "x"]).status == 403)
            let wrong = try await ConsoleHTTP.post(console.base + "/login", form: ["token": token + "x"])
            #expect(wrong.status == 401 && wrong.sessionCookie == nil)
            let right = try await ConsoleHTTP.post(console.base + "/login", form: ["token": token])
            #expect(right.status == 303 && right.header("Location") == "/")
            let setCookie = right.header("Set-Cookie") ?? ""
            #expect(setCookie.contains("HttpOnly") && setCookie.contains("SameSite=Strict"), "\(setCookie)")
            // Off loopback the console is reached through a TLS proxy: the cookie never goes in clear.
            #expect(setCookie.contains("; Secure"), "\(setCookie)")
            let cookie = try #require(right.sessionCookie)
            let overview = try await ConsoleHTTP.get(console.base + "/", cookie: cookie)
            #expect(overview.status == 200 && overview.body.contains("Log out"))
            #expect(!overview.body.contains(token), "the token is never written into a page")
            #expect(try await ConsoleHTTP.get(console.base + "/", cookie: "siwa_console=forged").status == 303)
            await console.stop()
        }
    }

    static func encode(_ text: String) -> String {
        text.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? ""
    }
}

/// `/accounts/{client_id}/{sub}` as the console writes its links.
func URLPart(_ clientID: String, _ sub: String) -> String {
    "/accounts/" + ConsoleTests.encode(clientID).replacingOccurrences(of: "%2E", with: ".")
        + "/" + ConsoleTests.encode(sub).replacingOccurrences(of: "%2E", with: ".")
}
