import AppleClient
import Foundation
import Postgres
import Testing
import StoredTokens

/// An account's page through the real stack (fake Apple, receiver, worker) and `siwa console`
/// reading with a worker login: a link, a deletion Apple answers 503 until it accepts, and Apple's
/// follow-up notification, each on the timeline, newest first, and never a code or token.
@Suite(.serialized) struct ConsoleTimelineTests {
    static let clientID = EndToEndStack.clientID

    @Test func timelineThroughLinkDeletionApples503sAndTheFinalRevoke() async throws {
        let database = try await LifecycleHarness.makeDatabase()
        let stack: EndToEndStack
        do { stack = try await EndToEndStack(database: database) } catch {
            await database.drop()
            throw error
        }
        do {
            try await database.withLogin(inRole: "siwa_worker") { url in
                let console = try await ConsoleProcess(databaseURL: url)
                do {
                    try await run(stack, console)
                } catch {
                    print("---- siwa console log ----\n\(console.process.log.suffix(4000))")
                    await console.stop()
                    throw error
                }
                await console.stop()
            }
            await stack.stop()
        } catch {
            await stack.stop()
            for process in stack.processes { print("---- \(process.name) log ----\n\(process.log.suffix(4000))") }
            await database.drop()
            throw error
        }
        await database.drop()
    }

    private func run(_ stack: EndToEndStack, _ console: ConsoleProcess) async throws {
        let db = try await stack.database.connect()
        defer { db.close() }
        let sub = "000111.console.0001"
        let page = console.base + URLPart(Self.clientID, sub)
        var secrets: [String] = []

        // Link: a code from the fake Apple, exchanged by the worker.
        let code = try await stack.code(sub: sub, email: "\(sub)@privaterelay.appleid.com")
        secrets.append(code)
        _ = try await db.query("SELECT siwa.link_account(\(Self.clientID), \(sub), 'user-console-1', \(code))")
        try await db.waitForStatus(sub, "active")
        let stored = try await db.query(
            "SELECT refresh_token_enc FROM siwa.accounts WHERE client_id = \(Self.clientID) AND sub = \(sub)")[0].decode([UInt8].self, at: 0)
        secrets.append(try TokenBox(configuration: stack.tokenKeys).open(stored, clientID: Self.clientID, sub: sub))
        let linked = try await ConsoleHTTP.get(page)
        #expect(linked.body.contains("active, linked"), "\(linked.body)")
        #expect(linked.body.contains("a refresh token is held"))

        // Deletion, while Apple answers 503: the page says so.
        try await stack.inject("revoke", Array(repeating: 503, count: 100))
        let revoke = try await db.query("SELECT siwa.request_deletion(\(Self.clientID), \(sub))")[0].decode(Int64.self, at: 0)
        try await db.waitFor("SELECT jsonb_array_length(errors) FROM siwa.jobs WHERE id = \(revoke)", timeout: .seconds(60)) { $0 >= 3 }
        let failing = try await ConsoleHTTP.get(page)
        #expect(failing.body.contains("deletion requested"), "\(failing.body)")
        #expect(failing.body.contains("revoke failing: Apple answered 503"), "\(failing.body)")
        #expect(failing.body.contains("pending_deletion"))
        #expect(failing.body.contains("http_503 (Apple answered 503)"))

        // Apple accepts; then sends its follow-up consent-revoked, which changes nothing.
        try await stack.inject("revoke", [])
        try await db.waitForStatus(sub, "deleted", timeout: .seconds(90))
        let simulate = try await Siwa.run(
            ["simulate", "consent-revoked", "--sub", sub, "--client-id", Self.clientID, "--receiver-url", stack.endpoint,
             "--fake-apple-url", stack.fakeURL], environment: stack.trustEnvironment)
        #expect(simulate.status == 0, "\(simulate.stderr)")
        try await db.waitFor("SELECT count(*) FROM siwa.notifications WHERE sub = \(sub) AND processed_at IS NOT NULL") { $0 == 1 }

        let done = try await ConsoleHTTP.get(page)
        #expect(done.status == 200)
        ConsoleTests.expectSafe(done, "the deleted account")
        let body = done.body
        #expect(body.contains("deleted") && body.contains("Apple accepted the revoke"), "\(body)")
        let errors = try await db.int("SELECT jsonb_array_length(errors) FROM siwa.jobs WHERE id = \(revoke)")
        #expect(body.components(separatedBy: "http_503 (Apple answered 503)").count - 1 == errors, "each failed attempt listed")
        #expect(body.contains("revoke job <a href=\"/jobs/\(revoke)\">#\(revoke)</a></strong>: <span class=\"state-completed\">completed</span>"), "\(body)")
        // Newest first: the follow-up, the deletion, the request, the link.
        let order = [
            "<strong>consent-revoked</strong> from Apple", "<strong>deleted</strong>", "<strong>deletion_requested</strong>",
            "<strong>linked</strong>",
        ]
        let positions = order.map { body.range(of: $0)?.lowerBound }
        #expect(positions.allSatisfy { $0 != nil }, "timeline lacks one of \(order): \(body)")
        #expect(positions.compactMap { $0 } == positions.compactMap { $0 }.sorted(), "not newest first")
        #expect(body.contains("outcome <strong>ignored_account_deleted</strong>"))
        for secret in secrets {
            for path in ["/", URLPart(Self.clientID, sub), "/jobs", "/jobs?kind=exchange", "/accounts?q=\(sub)"] {
                #expect(!(try await ConsoleHTTP.get(console.base + path)).body.contains(secret), "\(path) shows a code or token")
            }
        }
        print("console timeline page: \(body.utf8.count) bytes")
    }

}
