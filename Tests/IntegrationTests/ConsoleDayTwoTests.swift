import Foundation
import Postgres
import Testing

/// The console at 3 a.m. (Sources/Console/README.md, "Day two"): every page says when it was read and
/// refreshes itself unless paused; each job has a page with its attempts and actions, and job ids
/// link to it everywhere; the overview carries what `siwa status` reports.
@Suite(.serialized) struct ConsoleDayTwoTests {
    typealias Fixture = ConsoleFixture

    /// `as of <time>2026-12-05 10:40:00 UTC</time>`, within a minute of now.
    static func expectReadJustNow(_ body: String, _ what: String, sourceLocation: SourceLocation = #_sourceLocation) {
        guard let range = body.range(of: #"as of <time>[0-9-]+ [0-9:]+ UTC</time>"#, options: .regularExpression) else {
            Issue.record("\(what) does not say when it was read", sourceLocation: sourceLocation)
            return
        }
        let text = body[range].dropFirst("as of <time>".count).dropLast("</time>".count)
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "UTC")
        formatter.dateFormat = "yyyy-MM-dd HH:mm:ss 'UTC'"
        let read = formatter.date(from: String(text))
        #expect(read.map { abs($0.timeIntervalSinceNow) < 60 } == true, "\(what): as of \(text)", sourceLocation: sourceLocation)
    }

    @Test func everyPageSaysWhenItWasReadAndRefreshesUnlessPaused() async throws {
        try await ConsoleTests.withConsole { console, fixture, _ in
            let pages = [
                "/", "/accounts", "/accounts?q=user-deleting", "/jobs", "/jobs?state=discarded", "/jobs/\(fixture.discardedExchange)",
                URLPart(Fixture.clientID, Fixture.deletingSub), URLPart(Fixture.clientID, "000999.none"), "/jobs/99999",
            ]
            for page in pages {
                let answer = try await ConsoleHTTP.get(console.base + page)
                Self.expectReadJustNow(answer.body, page)
                #expect(answer.body.contains(#"<meta http-equiv="refresh" content="30">"#), "\(page) does not refresh")
                #expect(answer.body.contains("refreshes every 30 s") && answer.body.contains("refresh=off\">pause</a>"), "\(page)")
                let separator = page.contains("?") ? "&" : "?"
                let paused = try await ConsoleHTTP.get(console.base + page + separator + "refresh=off")
                Self.expectReadJustNow(paused.body, page + " paused")
                #expect(!paused.body.contains("http-equiv=\"refresh\""), "\(page) paused still refreshes")
                #expect(paused.body.contains("refresh paused") && paused.body.contains("resume (every 30 s)"), "\(page)")
            }
        }
    }

    @Test func aJobHasAPageWithItsAttemptsAndActionsAndIdsLinkToIt() async throws {
        try await ConsoleTests.withConsole { console, fixture, _ in
            let job = try await ConsoleHTTP.get(console.base + "/jobs/\(fixture.discardedExchange)")
            #expect(job.status == 200)
            ConsoleTests.expectSafe(job, "/jobs/{id}")
            let accountLink = "href=\"\(URLPart(Fixture.clientID, Fixture.scriptSub).replacingOccurrences(of: "&", with: "&amp;"))\""
            for text in [
                "<h1>Job #\(fixture.discardedExchange)</h1>", "<dd>exchange</dd>", accountLink, "state-discarded\">discarded",
                "2026-12-01 10:00:00 UTC", "http_503", "2026-12-01 10:00:02 UTC", "invalid_grant",
                "action=\"/jobs/\(fixture.discardedExchange)/retry\"",
            ] {
                #expect(job.body.contains(text), "the job page lacks \(text)")
            }
            #expect(!job.body.contains("—") && !job.body.contains("–"), "one way to show none")
            // Newest attempt first.
            let second = try #require(job.body.range(of: "invalid_grant")), first = try #require(job.body.range(of: "http_503"))
            #expect(second.lowerBound < first.lowerBound)

            let missing = try await ConsoleHTTP.get(console.base + "/jobs/99999")
            #expect(missing.status == 404 && missing.body.contains("There is no job #99999"))

            let link = "href=\"/jobs/\(fixture.discardedExchange)\""
            let list = try await ConsoleHTTP.get(console.base + "/jobs")
            #expect(list.body.contains(link), "the jobs list links the id")
            let timeline = try await ConsoleHTTP.get(console.base + URLPart(Fixture.clientID, Fixture.scriptSub))
            #expect(timeline.body.contains(link), "the timeline links the id")
            let deleting = try await ConsoleHTTP.get(console.base + URLPart(Fixture.clientID, Fixture.deletingSub))
            #expect(deleting.body.contains("href=\"/jobs/\(fixture.pendingRevoke)\""))
            for page in [timeline, deleting] { #expect(!page.body.contains("—"), "one way to show none") }
        }
    }

    /// The overview and `siwa status` read the same database with the same login: every fact the
    /// status prints is on the page (worker liveness and replication included).
    @Test func theOverviewCarriesWhatStatusReports() async throws {
        try await withMigratedDatabase { database in
            let db = try await database.connect()
            defer { db.close() }
            _ = try await Fixture.write(db)
            try await db.simpleQuery(
                """
                INSERT INTO siwa.webhook_endpoint (endpoint, registered_at, seen_at)
                VALUES ('https://app.example/hooks', now() - interval '1 day', now() - interval '2 minutes')
                """)
            try await database.withLogin(inRole: "siwa_worker") { url in
                let status = try await Siwa.run(["status", "--json"], environment: ["DATABASE_URL": url])
                let object = try #require(try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any], "\(status.stderr)")
                let text = try await Siwa.run(["status"], environment: ["DATABASE_URL": url])
                func fact(_ name: String) -> String? {
                    text.stdout.split(separator: "\n").first { $0.hasPrefix(name + "  ") }
                        .map { $0.dropFirst(name.count).trimmingCharacters(in: .whitespaces) }
                }
                let console = try await ConsoleProcess(databaseURL: url)
                let overview: ConsoleAnswer
                do { overview = try await ConsoleHTTP.get(console.base + "/") } catch {
                    await console.stop()
                    throw error
                }
                await console.stop()
                let body = overview.body
                #expect(overview.status == 200)

                let replication = try #require(fact("replication"))
                #expect(body.contains(replication.replacingOccurrences(of: "\"", with: "&quot;").replacingOccurrences(of: "'", with: "&#39;")), "replication: \(replication)")
                #expect(fact("change feed") == "not held back" && body.contains("<dt>change feed</dt><dd>not held back</dd>"))
                let webhooks = try #require(object["webhooks"] as? [String: Any])
                #expect(webhooks["endpoint"] as? String == "https://app.example/hooks")
                #expect(body.contains("https://app.example/hooks</span> was last seen <strong>2 min ago</strong>"), "worker liveness")
                let deletions = try #require(object["pending_deletions"] as? [String: Any])
                let pending = try #require(deletions["count"] as? Int)
                #expect(body.contains("<div class=\"muted\">pending deletions</div><div class=\"figure\">\(pending)</div>"))
                let jobs = try #require(object["jobs"] as? [String: Any])
                let discarded = try #require(jobs["discarded"] as? Int)
                #expect(body.contains("<a href=\"/jobs?state=discarded\">\(discarded)</a>"))
                let lastHour = try #require(object["last_hour"] as? [String: Any])
                let rejected = try #require(lastHour["rejected"] as? Int)
                #expect(rejected == 0 || body.contains("\(rejected) rejected"))
                for client in try #require(object["paused_clients"] as? [[String: Any]]) {
                    #expect(body.contains(client["client_id"] as? String ?? "?"))
                }
                // The hour axis names its zone; what is counted is named for what it is.
                #expect(body.contains("per hour (UTC)") && body.contains(" UTC</text>"))
                #expect(body.contains("Notifications rejected by the receiver, by reason") && !body.contains("Rejected deliveries"))
            }
        }
    }
}
