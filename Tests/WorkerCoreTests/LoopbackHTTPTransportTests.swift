#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif
import Foundation
import Testing
@testable import WorkerCore

/// The direct HTTP/1.1 transport for `http://` loopback endpoints against a server that answers
/// byte for byte as each test scripts it: the answer shapes a receiver may send (length, chunked,
/// to the end of the stream, an interim 100), keep-alive and its end, and the failures that must
/// read as failures. The common cases also run through URLSession (the https:// path), which must agree.
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

    @Test func chunkExtensionsAndTrailersAreRead() async throws {
        // Direct transport only: URLSession on Linux stops the whole process on this answer
        // ("Transfer completed, but there's no response", FoundationNetworking).
        let server = try ScriptedHTTPServer { _ in
            .answer("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n0\r\nTrailer: t\r\n\r\n")
        }
        defer { server.stop() }
        let client = try client(server, .automatic)
        #expect(await client.send(body: [], headers: []) == .answered(status: 200, bodyPrefix: "hello"))
        #expect(await client.send(body: [], headers: []) == .answered(status: 200, bodyPrefix: "hello"))
        #expect(server.accepted == 1)
    }

    @Test(arguments: transports) func aKeptConnectionThatDiesUnansweredIsRetriedOnceOnAFreshOne(
        _ transport: WebhookClient.Transport
    ) async throws {
        // The server reads the second request on the kept connection and closes without a byte of
        // answer (it went away between requests): nothing was answered, so the request goes again
        // on a new connection. On a new connection the same is a failure, not a loop.
        let server = try ScriptedHTTPServer { index in
            switch index {
            case 0: .answer("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            case 1, 3: .closeWithoutAnswer
            case 2: .answer("HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n", thenClose: true)
            default: .closeWithoutAnswer
            }
        }
        defer { server.stop() }
        let client = try client(server, transport)
        #expect(await client.send(body: [], headers: []) == .answered(status: 200, bodyPrefix: ""))
        #expect(await client.send(body: [], headers: []) == .answered(status: 201, bodyPrefix: ""))
        #expect(server.accepted == 2)
        try await server.waitForClosed(2)
        let unanswered = await client.send(body: [], headers: [])
        #expect(unanswered.failureReason == "connection", "\(unanswered)")
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
        // Bound and never listening: connections to it are refused, and nobody else can take it.
        let socketFD = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(socketFD) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(socketFD, $0, length) } }
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(socketFD, $0, &length) }
        }
        let url = try #require(URL(string: "http://127.0.0.1:\(UInt16(bigEndian: address.sin_port))/x"))
        let result = await WebhookClient(url: url, timeout: .seconds(10), maxConnections: 1, transport: transport)
            .send(body: [], headers: [])
        guard case .connectionFailed = result else {
            Issue.record("expected a connection failure, got \(result)")
            return
        }
        #expect(result.failureReason == "connection")
    }

    @Test func localhostIsReached() async throws {
        let server = try ScriptedHTTPServer { _ in .answer("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n") }
        defer { server.stop() }
        let url = try #require(URL(string: "http://localhost:\(server.port)/hooks"))
        #expect(await WebhookClient(url: url, timeout: .seconds(10), maxConnections: 1).send(body: [], headers: [])
            == .answered(status: 200, bodyPrefix: ""))
        #expect(server.heads.first?.lowercased().contains("\r\nhost: localhost:\(server.port)\r\n") == true)
    }

    @Test func onlyLoopbackHTTPIsSpokenToDirectly() throws {
        for (text, direct) in [
            ("http://127.0.0.1:9/x", true), ("http://localhost/x", true), ("http://[::1]:8080/", true), ("http://127.1.2.3:9/", true),
            ("https://127.0.0.1:9/x", false), ("http://10.0.0.1/x", false), ("http://example.com/x", false),
        ] {
            #expect((LoopbackHTTPTransport(url: try #require(URL(string: text)), timeout: .seconds(1)) != nil) == direct, "\(text)")
        }
    }
}

/// A TCP server on 127.0.0.1 that reads each request (head and Content-Length body) and writes
/// the bytes `script` gives for it (numbered across connections), then closes if told to.
final class ScriptedHTTPServer: @unchecked Sendable {
    // @unchecked: the listening descriptor is set once; all shared state is behind `state`'s lock.
    enum Reply: Sendable {
        case answer(String, thenClose: Bool = false)
        /// Never answers (the client's timeout ends it).
        case silent
        /// Closes the connection without a byte of answer.
        case closeWithoutAnswer
        /// Answers once `openGate()` was called (at most 60 s later).
        case heldUntilGateOpens(String)
    }

    private struct State {
        var accepted = 0
        var closed = 0
        var heads: [String] = []
        var bodies: [String] = []
        var descriptors: [Int32] = []
        var gateOpen = false
    }

    let port: Int
    private let listener: Int32
    private let state = LockedState(State())
    private let script: @Sendable (Int) -> Reply

    init(script: @escaping @Sendable (Int) -> Reply) throws {
        self.script = script
        let socketFD = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        guard withUnsafePointer(to: &address, { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(socketFD, $0, length) } }) == 0,
            listen(socketFD, 16) == 0,
            withUnsafeMutablePointer(to: &address, {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(socketFD, $0, &length) }
            }) == 0
        else {
            close(socketFD)
            throw CocoaError(.fileWriteUnknown)
        }
        listener = socketFD
        port = Int(UInt16(bigEndian: address.sin_port))
        let listening = socketFD
        Thread.detachNewThread { [self] in
            while true {
                let connection = accept(listening, nil, nil)
                guard connection >= 0 else {
                    // stop() shut it down; closed here, so no other test's socket can reuse the
                    // number while this thread still uses it.
                    close(listening)
                    return
                }
                state.withLock {
                    $0.accepted += 1
                    $0.descriptors.append(connection)
                }
                Thread.detachNewThread { [self] in serve(connection) }
            }
        }
    }

    var accepted: Int { state.withLock { $0.accepted } }
    var heads: [String] { state.withLock { $0.heads } }
    var bodies: [String] { state.withLock { $0.bodies } }

    /// Shuts the sockets down; each is closed by the thread using it (a number closed here could
    /// be reused by a parallel test's socket while that thread still reads from it).
    func stop() {
        shutdown(listener, Int32(SHUT_RDWR))
        state.withLock { state in
            for descriptor in state.descriptors { shutdown(descriptor, Int32(SHUT_RDWR)) }
        }
    }

    func openGate() { state.withLock { $0.gateOpen = true } }

    /// Waits (bounded) until `count` requests were read.
    func waitForRequests(_ count: Int) async throws {
        let deadline = ContinuousClock.now + .seconds(30)
        while state.withLock({ $0.heads.count }) < count {
            guard ContinuousClock.now < deadline else { throw CocoaError(.fileReadUnknown) }
            try await Task.sleep(for: .milliseconds(10))
        }
    }

    /// Waits (bounded) until `count` connections were closed by the server.
    func waitForClosed(_ count: Int) async throws {
        let deadline = ContinuousClock.now + .seconds(10)
        while state.withLock({ $0.closed }) < count {
            guard ContinuousClock.now < deadline else { throw CocoaError(.fileReadUnknown) }
            try await Task.sleep(for: .milliseconds(10))
        }
    }

    private func serve(_ connection: Int32) {
        var buffered: [UInt8] = []
        func fill() -> Bool {
            var chunk = [UInt8](repeating: 0, count: 4096)
            let count = chunk.withUnsafeMutableBytes { recv(connection, $0.baseAddress, $0.count, 0) }
            guard count > 0 else { return false }
            buffered += chunk[0..<count]
            return true
        }
        defer {
            state.withLock { state in
                // Under the lock: stop() never shuts down a number this has given back.
                state.descriptors.removeAll { $0 == connection }
                close(connection)
                state.closed += 1
            }
        }
        while true {
            var end = buffered.firstRange(of: [13, 10, 13, 10])
            while end == nil {
                guard fill() else { return }
                end = buffered.firstRange(of: [13, 10, 13, 10])
            }
            let head = String(decoding: buffered[..<end!.upperBound], as: UTF8.self)
            buffered.removeFirst(end!.upperBound)
            let length = head.lowercased().split(separator: "\r\n").first { $0.hasPrefix("content-length:") }
                .flatMap { Int($0.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces)) } ?? 0
            while buffered.count < length { guard fill() else { return } }
            let body = String(decoding: buffered[..<length], as: UTF8.self)
            buffered.removeFirst(length)
            let index = state.withLock { state -> Int in
                state.heads.append(head)
                state.bodies.append(body)
                return state.heads.count - 1
            }
            switch script(index) {
            case .silent:
                while fill() {}
                return
            case .closeWithoutAnswer:
                return
            case .heldUntilGateOpens(let text):
                let deadline = Date().addingTimeInterval(60)
                while !state.withLock({ $0.gateOpen }), Date() < deadline { usleep(5_000) }
                let bytes = Array(text.utf8)
                _ = bytes.withUnsafeBytes { send(connection, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            case .answer(let text, let thenClose):
                let bytes = Array(text.utf8)
                _ = bytes.withUnsafeBytes { send(connection, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                if thenClose { return }
            }
        }
    }
}

/// A value behind an NSLock (this test target does not depend on the Locking module).
final class LockedState<Value>: @unchecked Sendable {
    // @unchecked: `value` is only touched while `lock` is held.
    private let lock = NSLock()
    private var value: Value

    init(_ value: Value) { self.value = value }

    func withLock<T>(_ body: (inout Value) -> T) -> T {
        lock.lock()
        defer { lock.unlock() }
        return body(&value)
    }
}
