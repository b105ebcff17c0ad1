import Foundation
import TestTiming
import Testing

/// The console in a real browser: headless Chromium (Debian's `chromium`) loads the overview, an
/// account's timeline and a job's page; the test checks the DOM the browser built and keeps a screenshot of each.
@Suite(.serialized) struct ConsoleBrowserTests {
    static let chromium = "/usr/bin/chromium"

    @Test func headlessChromiumRendersTheOverviewAndATimeline() async throws {
        guard FileManager.default.isExecutableFile(atPath: Self.chromium) else {
            Issue.record("\(Self.chromium) is missing: install Debian's chromium (deploy/scripts/install-deps.sh chromium)")
            return
        }
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("siwa-console-screens-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        try await ConsoleTests.withConsole { console, fixture, _ in
            let overview = try await browse(console.base + "/", in: folder)
            #expect(overview.contains("<h1>Overview</h1>"), "\(overview.prefix(2000))")
            #expect(overview.contains("Jobs by kind and state"))
            #expect(overview.components(separatedBy: "<svg").count == 3, "both charts in the DOM")
            #expect(overview.contains(ConsoleFixture.pausedClient))
            let timelinePage = console.base + URLPart(ConsoleFixture.clientID, ConsoleFixture.scriptSub)
            let timeline = try await browse(timelinePage, in: folder)
            #expect(timeline.contains("<ol class=\"timeline\">"), "\(timeline.prefix(2000))")
            #expect(timeline.contains("exchange job <a href=\"/jobs/\(fixture.discardedExchange)\">#\(fixture.discardedExchange)</a>"))
            // The DOM holds the sub as text: the browser made no element of it.
            #expect(timeline.contains("000111.&lt;script&gt;alert(1)&lt;/script&gt;"))
            #expect(!timeline.lowercased().contains("<script"))
            let deleting = try await browse(console.base + URLPart(ConsoleFixture.clientID, ConsoleFixture.deletingSub), in: folder)
            #expect(deleting.contains("revoke failing: Apple answered 503 five times"))

            #expect(overview.contains("as of <time>") && overview.contains("<dt>replication</dt>"), "the overview's freshness and health")
            let jobPage = console.base + "/jobs/\(fixture.discardedExchange)"
            let job = try await browse(jobPage, in: folder)
            #expect(job.contains("<h1>Job #\(fixture.discardedExchange)</h1>") && job.contains("invalid_grant") && job.contains("as of <time>"),
                    "\(job.prefix(2000))")

            for (name, url) in [("overview", console.base + "/"), ("timeline", timelinePage), ("job", jobPage)] {
                let path = folder.appendingPathComponent("\(name).png").path
                try await screenshot(url, to: path, in: folder)
                let png = try Data(contentsOf: URL(fileURLWithPath: path))
                #expect(png.starts(with: [0x89, 0x50, 0x4E, 0x47]), "\(name) screenshot is a PNG")
                let html = try await ConsoleHTTP.get(url)
                print("console \(name): \(html.body.utf8.count) bytes of HTML, screenshot \(path) (\(png.count) bytes)")
            }
        }
    }

    /// `chromium --headless --dump-dom URL`: the DOM after parsing, as the browser serialises it.
    private func browse(_ url: String, in folder: URL) async throws -> String {
        let output = folder.appendingPathComponent("dom-\(UUID().uuidString).html")
        try await Self.runChromium(["--dump-dom", url], stdout: output, in: folder)
        return try String(contentsOf: output, encoding: .utf8)
    }

    private func screenshot(_ url: String, to path: String, in folder: URL) async throws {
        try await Self.runChromium(["--screenshot=\(path)", "--window-size=1280,1400", "--hide-scrollbars", url],
                              stdout: folder.appendingPathComponent("screenshot.log"), in: folder)
    }

    /// One headless run with a profile of its own (tests beside it may run another Chromium), bounded.
    /// Also WebSignInBrowserTests'.
    static func runChromium(_ arguments: [String], stdout: URL, in folder: URL) async throws {
        let profile = folder.appendingPathComponent("profile-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: profile) }
        let outcome = try await ProgramRun.run(
            Self.chromium,
            [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--disable-extensions",
                "--disable-background-networking", "--user-data-dir=\(profile.path)",
            ] + arguments,
            environment: ["HOME": folder.path, "PATH": "/usr/bin:/bin"], timeout: .seconds(120))
        try outcome.stdout.write(to: stdout, atomically: true, encoding: .utf8)
        guard outcome.status == 0 else {
            throw ServiceProcessError(message: "chromium exited \(outcome.status):\n\(outcome.stderr)")
        }
    }
}
