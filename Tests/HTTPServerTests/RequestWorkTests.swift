import Foundation
import HTTPServer
import Testing
import TestTiming

#if canImport(Glibc)
    import Glibc
#endif

/// How a request's work runs and ends (Sources/HTTPServer/README.md): an `async` handler is a task
/// on the standard executors while its connection is suspended; the request deadline, a client
/// that has gone, and `stop()` each cancel that task, so its awaited call ends at once.
@Suite("HTTPServer: a request's work and how it ends")
struct RequestWorkTests {
    /// A handler that waits (cancellably) until the test lets it go, counting how its wait ended.
    final class Work: Sendable {
        let arrived = Counter()
        let cancelled = Counter()
        let released = Counter()

        func respond(_ request: HTTPRequest) async -> HTTPResponse {
            arrived.increment()
            let deadline = ContinuousClock.now + TestTimeScale.scaled(.seconds(120))
            while released.value == 0, ContinuousClock.now < deadline {
                do { try await Task.sleep(for: .milliseconds(5)) } catch {
                    cancelled.increment()
                    return .text(status: 503, "cancelled")
                }
            }
            return .text("finished \(request.path)")
        }
    }

    /// A started server answering through `work`, and a client whose request it is working on.
    static func requestInFlight(
        _ configuration: HTTPServer.Configuration, _ work: Work, waitForArrival: Bool = true
    ) async throws -> (HTTPServer, RawHTTPClient) {
        let server = HTTPServer(configuration: configuration) { await work.respond($0) }
        try server.start()
        let client = try RawHTTPClient(port: server.port, receiveTimeout: 60)
        client.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        if waitForArrival { try await waitFor(work.arrived) }
        return (server, client)
    }

    static func waitFor(_ counter: Counter, _ value: Int = 1) async throws {
        try await waitUntil("the counter reached \(value)", timeout: .seconds(60), every: .milliseconds(5)) { counter.value >= value }
    }

    @Test func aWaitingRequestHoldsUpNoOtherConnection() async throws {
        let work = Work()
        // One pool thread: a request that held it while it waits would hold up the other.
        let server = HTTPServer(configuration: .init(host: "127.0.0.1", port: 0, threadCount: 1)) { request in
            if request.path == "/other" {
                work.released.increment()
                return .text("other")
            }
            return await work.respond(request)
        }
        try server.start()
        defer { server.stop() }
        let waiting = try RawHTTPClient(port: server.port, receiveTimeout: 60)
        waiting.send("GET /waiting HTTP/1.1\r\nHost: x\r\n\r\n")
        try await Self.waitFor(work.arrived)
        let other = try RawHTTPClient(port: server.port, receiveTimeout: 60)
        other.send("GET /other HTTP/1.1\r\nHost: x\r\n\r\n")
        let otherAnswer = await other.read { $0.hasSuffix("other") }
        #expect(otherAnswer.text.hasSuffix("other"))
        let (text, _) = await waiting.read { $0.hasSuffix("finished /waiting") }
        #expect(text.hasSuffix("finished /waiting"))
        #expect(work.cancelled.value == 0)
    }

    @Test func stopLetsARequestInFlightAnswerWithinTheGracePeriod() async throws {
        let work = Work()
        let (server, client) = try await Self.requestInFlight(.init(host: "127.0.0.1", port: 0, shutdownGracePeriod: TestTimeScale.scaled(.seconds(30))), work)
        let stopped = Counter()
        Thread.detachNewThread {
            server.stop()
            stopped.increment()
        }
        // Answers only once `stop()` is under way (the port reads 0 from its first step).
        try await waitUntil("stop() is under way (the port reads 0)", timeout: .seconds(30), every: .milliseconds(5)) { server.port == 0 }
        work.released.increment()
        let (text, _) = await client.read { $0.hasSuffix("finished /") }
        #expect(text.hasPrefix("HTTP/1.1 200"))
        #expect(text.lowercased().contains("connection: close"))
        try await Self.waitFor(stopped)
        #expect(stopped.value == 1)
        #expect(work.cancelled.value == 0)
    }

    @Test func stopEndsWorkStillRunningAfterTheGracePeriod() async throws {
        let work = Work()
        let (server, client) = try await Self.requestInFlight(.init(host: "127.0.0.1", port: 0, shutdownGracePeriod: .milliseconds(200)), work)
        await onOwnThread { server.stop() }
        let (text, _) = await client.read { $0.contains("shutting_down") }
        #expect(text.hasPrefix("HTTP/1.1 503"))
        // The handler's wait was cancelled, not left to run for its two minutes.
        try await Self.waitFor(work.cancelled)
        #expect(work.cancelled.value == 1)
    }

    @Test func theDeadlineEndsWorkInFlight() async throws {
        let work = Work()
        let (server, client) = try await Self.requestInFlight(.init(host: "127.0.0.1", port: 0, workDeadline: .milliseconds(400)), work, waitForArrival: false)
        defer { server.stop() }
        // The handler's own answer, once its wait was cancelled.
        let (text, _) = await client.read { $0.contains("cancelled") }
        #expect(text.hasPrefix("HTTP/1.1 503"))
        #expect(work.cancelled.value == 1)
    }

    @Test func aClientThatHasGoneEndsItsRequestsWork() async throws {
        let work = Work()
        let (server, client) = try await Self.requestInFlight(.init(host: "127.0.0.1", port: 0), work)
        defer { server.stop() }
        client.hangUp()
        try await Self.waitFor(work.cancelled)
        #expect(work.cancelled.value == 1)
    }

    /// A handler that does not wait is answered on the thread that started it, before `start`
    /// returns: the task runs there until its first wait (`Task.immediate`), so such a request never
    /// goes through an executor thread (and one that waits skips that hand-off at its start).
    @Test func aHandlerThatDoesNotWaitAnswersBeforeStartReturns() {
        let answered = Counter()
        let handler = AsyncHTTPHandler { request in .text("at once \(request.path)") }
        let endWork = handler.start(HTTPRequest(method: "GET", path: "/")) { _ in answered.increment() }
        #expect(answered.value == 1)
        #expect(endWork != nil)
    }
}
