import Foundation
import ScriptedHTTPServer
import Testing
@testable import WorkerCore

/// The webhook sender's two transports against a server that answers byte for byte as each test
/// scripts it: the direct one (over LoopbackHTTPClient, whose own tests are in LoopbackHTTPTests)
/// and URLSession (the https:// path) must give a delivery the same result for each answer shape
/// and failure; the direct one's exchanges block threads of their own, at most `threadLimit` at once.
@Suite struct LoopbackHTTPTransportTests {
    static let transports: [WebhookClient.Transport] = [.automatic, .urlSession]

    func client(_ server: ScriptedHTTPServer, _ transport: WebhookClient.Transport, path: String = "/hooks/siwa?key=k%20v",
                timeout: Duration = .seconds(10)) throws -> WebhookClient {
        WebhookClient(url: try #require(URL(string: "http://127.0.0.1:\(server.port)\(path)")), timeout: timeout, maxConnections: 4,
                      transport: transport)
    }

    @Test(arguments: transports) func lengthAnswersKeepTheConnection(_ transport: WebhookClient.Transport) async throws {
        let server = try ScriptedHTTPServer { _ in .answer("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello") }
        defer { server.stop() }
        let client = try client(server, transport)
        for _ in 0..<3 {
            #expect(await client.send(body: Array("{}".utf8), headers: [("webhook-id", "1")]) == .answered(status: 200, bodyPrefix: "hello"))
        }
        if transport == .automatic { #expect(server.accepted == 1) }
        let head = try #require(server.heads.first)
        #expect(head.hasPrefix("POST /hooks/siwa?key=k%20v HTTP/1.1\r\n"))
        #expect(head.lowercased().contains("\r\nhost: 127.0.0.1:\(server.port)\r\n"))
        #expect(head.lowercased().contains("\r\nwebhook-id: 1\r\n"))
        #expect(server.bodies.allSatisfy { $0 == "{}" })
    }

    @Test(arguments: transports) func chunkedAnswersAreReadToTheirEnd(_ transport: WebhookClient.Transport) async throws {
        let server = try ScriptedHTTPServer { _ in
            .answer("HTTP/1.1 202 Accepted\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
        }
        defer { server.stop() }
        let client = try client(server, transport)
        #expect(await client.send(body: [], headers: []) == .answered(status: 202, bodyPrefix: "hello world"))
        #expect(await client.send(body: [], headers: []) == .answered(status: 202, bodyPrefix: "hello world"))
        if transport == .automatic { #expect(server.accepted == 1) }
    }

    @Test func exchangesHeldBySlowEndpointsDoNotHoldBackTheNext() async throws {
        // Eight requests the server holds unanswered, then one it answers at once: that one must be
        // answered while the eight still wait (they are let go only after it). A transport whose
        // blocking calls share a pool sized to the CPUs would run it only after the held ones timed out.
        let held = 8
        let server = try ScriptedHTTPServer { index in
            index < held ? .heldUntilGateOpens("HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nheld") : .answer("HTTP/1.1 204 No Content\r\n\r\n")
        }
        defer { server.stop() }
        let client = try client(server, .automatic, timeout: .seconds(60))
        let slow = (0..<held).map { _ in Task { await client.send(body: [], headers: []) } }
        try await server.waitForRequests(held)
        #expect(await client.send(body: [], headers: []) == .answered(status: 204, bodyPrefix: ""))
        server.openGate()
        for task in slow {
            let result = await task.value
            #expect(result == .answered(status: 200, bodyPrefix: "held"), "\(result)")
        }
    }

    @Test func exchangesBeyondTheThreadLimitWaitWithoutAThread() async throws {
        // Five held requests through a transport allowed two blocking threads: the server never
        // holds more than two at once, and all five are answered once it lets go.
        let server = try ScriptedHTTPServer { _ in .heldUntilGateOpens("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n") }
        defer { server.stop() }
        let url = try #require(URL(string: "http://127.0.0.1:\(server.port)/hooks"))
        let transport = try #require(LoopbackHTTPTransport(url: url, timeout: .seconds(60), threadLimit: 2))
        let sends = (0..<5).map { _ in Task { await transport.send(body: [], headers: []) } }
        try await server.waitForRequests(2)
        server.openGate()
        for send in sends { #expect(await send.value == .answered(status: 200, bodyPrefix: "")) }
        #expect(server.mostHeldAtOnce == 2)
    }

    @Test(arguments: transports) func aClosedConnectionIsReplacedWithoutFailingTheDelivery(_ transport: WebhookClient.Transport)
        async throws
    {
        // The first answer says nothing about closing, then the server closes anyway (an idle
        // timeout): the next delivery must not fail for it. Then an announced close, then a body
        // that runs to the end of the stream.
        let server = try ScriptedHTTPServer { index in
            switch index {
            case 0: .answer("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", thenClose: true)
            case 1: .answer("HTTP/1.1 201 Created\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", thenClose: true)
            default: .answer("HTTP/1.0 500 Internal Server Error\r\n\r\nbroken", thenClose: true)
            }
        }
        defer { server.stop() }
        let client = try client(server, transport)
        #expect(await client.send(body: [], headers: []) == .answered(status: 200, bodyPrefix: ""))
        try await server.waitForClosed(1)
        #expect(await client.send(body: [], headers: []) == .answered(status: 201, bodyPrefix: "ok"))
        #expect(await client.send(body: [], headers: []) == .answered(status: 500, bodyPrefix: "broken"))
        #expect(server.accepted == 3)
        #expect(server.heads.count == 3, "each delivery was sent once")
    }

    @Test(arguments: transports) func anInterimContinueIsSkippedAndARedirectIsTheAnswer(_ transport: WebhookClient.Transport)
        async throws
    {
        let server = try ScriptedHTTPServer { index in
            index == 0
                ? .answer("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n")
                : .answer("HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n")
        }
        defer { server.stop() }
        let client = try client(server, transport)
        #expect(await client.send(body: [], headers: []) == .answered(status: 204, bodyPrefix: ""))
        let redirected = await client.send(body: [], headers: [])
        #expect(redirected == .answered(status: 302, bodyPrefix: ""))
        #expect(redirected.failureReason == "redirect")
        #expect(server.heads.count == 2, "the redirect was not followed")
    }

    @Test(arguments: transports) func noAnswerWithinTheTimeoutIsATimeout(_ transport: WebhookClient.Transport) async throws {
        let server = try ScriptedHTTPServer { _ in .silent }
        defer { server.stop() }
        let client = try client(server, transport, timeout: .milliseconds(300))
        #expect(await client.send(body: [], headers: []) == .timedOut)
    }

    @Test(arguments: transports) func aRefusedConnectionIsAConnectionFailure(_ transport: WebhookClient.Transport) async throws {
        let refusing = RefusingPort()
        defer { refusing.close() }
        let url = try #require(URL(string: "http://127.0.0.1:\(refusing.port)/x"))
        let result = await WebhookClient(url: url, timeout: .seconds(10), maxConnections: 1, transport: transport)
            .send(body: [], headers: [])
        guard case .connectionFailed = result else {
            Issue.record("expected a connection failure, got \(result)")
            return
        }
        #expect(result.failureReason == "connection")
    }
}
