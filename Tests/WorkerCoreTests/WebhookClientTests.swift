import Foundation
import ScriptedHTTPServer
import TestTiming
import Testing
import Webhooks

/// The webhook sender against an endpoint that answers byte for byte as each test scripts it, over
/// `http://` and over real TLS: each answer shape is a delivery, a failed attempt, or (a 2xx head
/// followed by a body too large or broken) a delivery as its status says; never a crash. The
/// clients' timeouts, the trickle's length and the suite's limit scale by `TestTimeScale`.
@Suite(.timeLimit(.minutes(TestTimeScale.scaled(minutes: 2)))) struct WebhookClientTests {
    enum Scheme: String, CaseIterable, Sendable { case http, https }

    func server(_ scheme: Scheme, _ script: @escaping @Sendable (Int) -> ScriptedHTTPServer.Reply) throws -> ScriptedHTTPServer {
        try ScriptedHTTPServer(tls: scheme == .https ? .localhost : nil, script: script)
    }

    func client(_ server: ScriptedHTTPServer, _ scheme: Scheme, path: String = "/hooks/siwa?key=k%20v",
                timeout: Duration = .seconds(20)) throws -> WebhookClient {
        WebhookClient(url: try #require(URL(string: "\(scheme.rawValue)://127.0.0.1:\(server.port)\(path)")), timeout: TestTimeScale.scaled(timeout),
                      caCertificates: TLSFixture.caPEM)
    }

    @Test(arguments: Scheme.allCases) func deliveriesKeepTheConnection(_ scheme: Scheme) async throws {
        let server = try server(scheme) { _ in .answer("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello") }
        defer { server.stop() }
        let client = try client(server, scheme)
        for _ in 0..<3 {
            #expect(await client.send(body: Array("{}".utf8), headers: [("webhook-id", "1")]) == .answered(status: 200, bodyPrefix: "hello"))
        }
        #expect(server.accepted == 1)
        let head = try #require(server.heads.first)
        #expect(head.hasPrefix("POST /hooks/siwa?key=k%20v HTTP/1.1\r\n"))
        #expect(head.lowercased().contains("\r\nhost: 127.0.0.1:\(server.port)\r\n"))
        #expect(head.lowercased().contains("\r\nwebhook-id: 1\r\n"))
        #expect(head.lowercased().contains("\r\ncontent-type: application/json\r\n"))
        #expect(server.bodies.allSatisfy { $0 == "{}" })
    }

    @Test(arguments: Scheme.allCases) func aChunkedAnswerWithTrailerAndExtensionsIsDelivered(_ scheme: Scheme) async throws {
        let server = try server(scheme) { _ in
            .answer("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;a=b\r\nhello\r\n0\r\nX-Trailer: t\r\n\r\n")
        }
        defer { server.stop() }
        let client = try client(server, scheme)
        #expect(await client.send(body: [], headers: []) == .answered(status: 200, bodyPrefix: "hello"))
        #expect(await client.send(body: [], headers: []) == .answered(status: 200, bodyPrefix: "hello"))
        #expect(server.accepted == 1)
    }

    @Test(arguments: Scheme.allCases) func a2xxHeadCountsWhateverTheBody(_ scheme: Scheme) async throws {
        // Too large, reset mid-body, a broken chunk, trickled past the timeout: the head said 2xx.
        // The trickle lasts twice the timeout, both times `TestTimeScale`.
        let trickled = Int(200 * TestTimeScale.factor)
        let server = try server(scheme) { index in
            switch index {
            case 0: .endless(head: "HTTP/1.1 200 OK\r\nContent-Length: 104857600\r\n\r\n", bodyBytes: 100 << 20)
            case 1: .answerThenReset("HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab")
            case 2: .answer("HTTP/1.1 202 Accepted\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", thenClose: true)
            default: .trickle(String(repeating: "z", count: trickled), interval: .milliseconds(80), afterHead: "HTTP/1.1 201 Created\r\nContent-Length: \(trickled)\r\n\r\n")
            }
        }
        defer { server.stop() }
        let client = try client(server, scheme, timeout: .seconds(8))
        for status in [200, 204, 202, 201] {
            let result = await client.send(body: [], headers: [])
            guard case .answered(status, _) = result else {
                Issue.record("expected \(status), got \(result)")
                continue
            }
        }
    }

    @Test(arguments: Scheme.allCases) func aHeadThatNeverEndsIsAFailedAttempt(_ scheme: Scheme) async throws {
        let server = try server(scheme) { index in
            index == 0 ? .answerThenReset("HTTP/1.1 200 OK\r\nContent-Le") : .answer("HTTP/1.1 200 OK\r\nno colon\r\n\r\n", thenClose: true)
        }
        defer { server.stop() }
        let client = try client(server, scheme)
        for _ in 0..<2 {
            let result = await client.send(body: [], headers: [])
            guard case .connectionFailed = result else {
                Issue.record("expected a failed attempt, got \(result)")
                continue
            }
        }
    }

    @Test func aCertificateThatDoesNotVerifyIsAFailedAttempt() async throws {
        for fixture in [TLSFixture.unknownCA, .wrongHost] {
            let server = try ScriptedHTTPServer(tls: fixture) { _ in .answer("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n") }
            defer { server.stop() }
            let result = try await client(server, .https).send(body: [], headers: [])
            guard case .connectionFailed(let detail) = result else {
                Issue.record("\(fixture): expected a failed attempt, got \(result)")
                continue
            }
            #expect(detail.hasPrefix("tls"), "\(detail)")
            #expect(server.heads.isEmpty)
        }
    }

    @Test func exchangesHeldBySlowEndpointsDoNotHoldBackTheNext() async throws {
        // Eight requests the server holds unanswered, then one it answers at once: that one must be
        // answered while the eight still wait (they are let go only after it).
        let held = 8
        let server = try ScriptedHTTPServer { index in
            index < held ? .heldUntilGateOpens("HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nheld") : .answer("HTTP/1.1 204 No Content\r\n\r\n")
        }
        defer { server.stop() }
        let client = try client(server, .http, timeout: .seconds(60))
        let slow = (0..<held).map { _ in Task { await client.send(body: [], headers: []) } }
        try await server.waitForRequests(held)
        #expect(await client.send(body: [], headers: []) == .answered(status: 204, bodyPrefix: ""))
        server.openGate()
        for task in slow {
            let result = await task.value
            #expect(result == .answered(status: 200, bodyPrefix: "held"), "\(result)")
        }
    }

    @Test(arguments: Scheme.allCases) func aClosedConnectionIsReplacedWithoutFailingTheDelivery(_ scheme: Scheme) async throws {
        let server = try server(scheme) { index in
            switch index {
            case 0: .answer("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", thenClose: true)
            case 1: .answer("HTTP/1.1 201 Created\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", thenClose: true)
            default: .answer("HTTP/1.0 500 Internal Server Error\r\n\r\nbroken", thenClose: true)
            }
        }
        defer { server.stop() }
        let client = try client(server, scheme)
        #expect(await client.send(body: [], headers: []) == .answered(status: 200, bodyPrefix: ""))
        try await server.waitForClosed(1)
        #expect(await client.send(body: [], headers: []) == .answered(status: 201, bodyPrefix: "ok"))
        #expect(await client.send(body: [], headers: []) == .answered(status: 500, bodyPrefix: "broken"))
        #expect(server.accepted == 3)
        #expect(server.heads.count == 3, "each delivery was sent once")
    }

    @Test(arguments: Scheme.allCases) func anInterimContinueIsSkippedAndARedirectIsTheAnswer(_ scheme: Scheme) async throws {
        let server = try server(scheme) { index in
            index == 0
                ? .answer("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n")
                : .answer("HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n")
        }
        defer { server.stop() }
        let client = try client(server, scheme)
        #expect(await client.send(body: [], headers: []) == .answered(status: 204, bodyPrefix: ""))
        let redirected = await client.send(body: [], headers: [])
        #expect(redirected == .answered(status: 302, bodyPrefix: ""))
        #expect(redirected.failureReason == "redirect")
        #expect(server.heads.count == 2, "the redirect was not followed")
    }

    @Test(arguments: Scheme.allCases) func noAnswerWithinTheTimeoutIsATimeout(_ scheme: Scheme) async throws {
        let server = try server(scheme) { _ in .silent }
        defer { server.stop() }
        #expect(try await client(server, scheme, timeout: .milliseconds(500)).send(body: [], headers: []) == .timedOut)
    }

    @Test func aRefusedConnectionIsAConnectionFailure() async throws {
        let refusing = try RefusingPort()
        defer { refusing.release() }
        let url = try #require(URL(string: "http://127.0.0.1:\(refusing.port)/x"))
        let result = await WebhookClient(url: url, timeout: TestTimeScale.scaled(.seconds(10))).send(body: [], headers: [])
        guard case .connectionFailed = result else {
            Issue.record("expected a connection failure, got \(result)")
            return
        }
        #expect(result.failureReason == "connection")
    }
}
