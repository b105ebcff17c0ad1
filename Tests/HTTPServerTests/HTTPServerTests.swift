import Dispatch
import Foundation
import HTTPServer
import OutboundHTTP
import Synchronization
import Testing
import TestTiming

@Suite("HTTPServer over libmicrohttpd")
struct HTTPServerTests {
    /// Starts a server on 127.0.0.1, port 0, runs `body`, and stops it.
    func withServer<T>(
        maxBodyBytes: Int = 65536, connectionTimeout: Duration = .seconds(10), handler: any HTTPHandler,
        _ body: (HTTPServer) async throws -> T
    ) async throws -> T {
        let configuration = HTTPServer.Configuration(
            host: "127.0.0.1", port: 0, threadCount: 2, connectionTimeout: connectionTimeout,
            maxBodyBytes: maxBodyBytes, shutdownGracePeriod: .seconds(1))
        let server = HTTPServer(configuration: configuration, handler: handler)
        try server.start()
        #expect(server.port > 0)
        let result: T
        do {
            result = try await body(server)
        } catch {
            await Self.stop(server)
            throw error
        }
        await Self.stop(server)
        return result
    }

    /// `stop()` blocks (grace period): keep it off the cooperative pool.
    static func stop(_ server: HTTPServer) async {
        await onOwnThread { server.stop() }
    }

    static let client = HTTPClient()

    /// `headers` of the answer by lowercased name. The timeout bounds a stuck server (times
    /// `TestTimeScale`: 30 s ran out under ThreadSanitizer); no speed test.
    func send(_ method: String, _ path: String, port: Int, headers: [String: String] = [:], body: Data? = nil)
        async throws -> (status: Int, headers: [String: String], body: Data)
    {
        let response = try await Self.client.send(
            HTTPRequest(method: method, url: "http://127.0.0.1:\(port)\(path)", headers: headers.map { ($0.key, $0.value) },
                        body: Array(body ?? Data()), timeout: TestTimeScale.scaled(.seconds(30))))
        return (response.status, response.headers, Data(response.body))
    }

    /// Echoes what it saw as JSON, synchronously.
    static let echo = ClosureHTTPHandler(synchronous: { request in
        let object: [String: Any] = [
            "method": request.method, "path": request.path, "query": request.query,
            "x-test": request.header("X-Test") ?? "", "body": request.bodyText,
            "remote": request.remoteAddress ?? "",
        ]
        let json = try! JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
        var response = HTTPResponse.json(status: 201, String(decoding: json, as: UTF8.self))
        response.headers.append(("X-Echo", "yes"))
        return response
    })

    @Test func getAndPostRoundTrip() async throws {
        try await withServer(handler: Self.echo) { server in
            let get = try await send("GET", "/hello%20world?a=1&b=two%20words", port: server.port,
                                     headers: ["X-Test": "header value"])
            #expect(get.status == 201)
            let getJSON = try #require(try JSONSerialization.jsonObject(with: get.body) as? [String: Any])
            #expect(getJSON["method"] as? String == "GET")
            #expect(getJSON["path"] as? String == "/hello world")
            #expect(getJSON["query"] as? [String: String] == ["a": "1", "b": "two words"])
            #expect(getJSON["x-test"] as? String == "header value")
            #expect(getJSON["remote"] as? String == "127.0.0.1")
            #expect(get.headers["content-type"] == "application/json")
            #expect(get.headers["x-echo"] == "yes")

            let payload = #"{"payload":"eyJhbGciOiJSUzI1NiJ9.e30.sig"}"#
            let post = try await send("POST", "/notifications", port: server.port,
                                      headers: ["Content-Type": "application/json"], body: Data(payload.utf8))
            #expect(post.status == 201)
            let postJSON = try #require(try JSONSerialization.jsonObject(with: post.body) as? [String: Any])
            #expect(postJSON["method"] as? String == "POST")
            #expect(postJSON["body"] as? String == payload)
        }
    }

    /// libmicrohttpd's own unescaping turns `%00` into a NUL that ends the C string: the handler saw
    /// `/v1/accounts/c/v` for `/v1/accounts/c/v%00x`. Such a request, and escapes that are not UTF-8,
    /// are 400 before any handler runs; `%2F`, `%25` and UTF-8 escapes still decode.
    @Test func aPercentZeroZeroOrNonUTF8EscapeIs400BeforeTheHandler() async throws {
        let handled = Counter()
        let handler = ClosureHTTPHandler(synchronous: { request in
            handled.increment()
            let json = try! JSONSerialization.data(withJSONObject: ["path": request.path, "query": request.query])
            return .json(status: 201, String(decoding: json, as: UTF8.self))
        })
        try await withServer(handler: handler) { server in
            for target in ["/v1/accounts/c/v%00x", "/v1/accounts/c/v?x=a%00b", "/v1/accounts/c/v?a%00=1", "/p%FF", "/p?v=%C3"] {
                let answer = try await send("PATCH", target, port: server.port)
                #expect(answer.status == 400, "\(target)")
                #expect(String(decoding: answer.body, as: UTF8.self) == #"{"error":"bad_request"}"#, "\(target)")
            }
            #expect(handled.value == 0)
            let decoded = try await send("GET", "/a%2Fb%25%C3%A9?q=%E2%9C%93", port: server.port)
            #expect(decoded.status == 201)
            let json = try #require(try JSONSerialization.jsonObject(with: decoded.body) as? [String: Any])
            #expect(json["path"] as? String == "/a/b%\u{e9}")
            #expect(json["query"] as? [String: String] == ["q": "\u{2713}"])
            #expect(handled.value == 1)
        }
    }

    @Test func contentTypeIsAlwaysSent() async throws {
        let handler = ClosureHTTPHandler(synchronous: { _ in HTTPResponse(status: 204) })
        try await withServer(handler: handler) { server in
            let client = try RawHTTPClient(port: server.port)
            client.send("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            let (text, _) = await client.read()
            #expect(text.hasPrefix("HTTP/1.1 204"))
            #expect(text.lowercased().contains("content-type: application/octet-stream"))
        }
    }

    @Test func slowResponseFromAnotherThreadDoesNotBlockOthers() async throws {
        let slowArrived = Counter()
        let fastServed = Counter()
        let fastSawSlowPending = Counter()
        let handler = ClosureHTTPHandler { request, respond in
            if request.path == "/slow" {
                slowArrived.increment()
                // Answer from another thread, at least 50 ms later, and only after the fast
                // request was served (or 2 s passed): if the slow one held the server's only
                // thread, the fast one could not be served and this would time out.
                Thread.detachNewThread {
                    usleep(50_000)
                    try? waitUntilBlocking("the fast request was served", timeout: .seconds(2), every: .milliseconds(1)) {
                        fastServed.value > 0
                    }
                    respond(.text("slow"))
                }
            } else {
                if slowArrived.value == 1 { fastSawSlowPending.increment() }
                fastServed.increment()
                respond(.text("fast"))
            }
        }
        // One server thread: the fast request can only be answered if the slow one holds none.
        let configuration = HTTPServer.Configuration(host: "127.0.0.1", port: 0, threadCount: 1)
        let server = HTTPServer(configuration: configuration, handler: handler)
        try server.start()
        let port = server.port
        async let slow = send("GET", "/slow", port: port)
        while slowArrived.value == 0 { try await Task.sleep(for: .milliseconds(1)) }
        let fast = try await send("GET", "/fast", port: port)
        #expect(String(decoding: fast.body, as: UTF8.self) == "fast")
        #expect(fastSawSlowPending.value == 1)
        let slowResult = try await slow
        #expect(slowResult.status == 200)
        #expect(String(decoding: slowResult.body, as: UTF8.self) == "slow")
        await Self.stop(server)
    }

    @Test func asyncHandlerAdapter() async throws {
        let handler = AsyncHTTPHandler { request in
            try? await Task.sleep(for: .milliseconds(5))
            return .json(#"{"path":"\#(request.path)"}"#)
        }
        try await withServer(handler: handler) { server in
            let result = try await send("GET", "/async", port: server.port)
            #expect(result.status == 200)
            #expect(String(decoding: result.body, as: UTF8.self) == #"{"path":"/async"}"#)
        }
    }

    @Test func keepAliveConnectionServesSuspendedRequestsInTurn() async throws {
        let handler = AsyncHTTPHandler { request in
            try? await Task.sleep(for: .milliseconds(5))
            return .text("answer \(request.path)")
        }
        try await withServer(handler: handler) { server in
            // A bound for a server that never answers, not a speed requirement (5 s failed at load 12).
            let client = try RawHTTPClient(port: server.port, receiveTimeout: 30)
            for index in 0..<3 {
                client.send("POST /\(index) HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
                let (text, _) = await client.read { $0.hasSuffix("answer /\(index)") }
                #expect(text.hasPrefix("HTTP/1.1 200"))
                #expect(text.hasSuffix("answer /\(index)"))
                #expect(!text.lowercased().contains("connection: close"))
            }
            #expect(server.connectionsAccepted == 1)
            let another = try RawHTTPClient(port: server.port, receiveTimeout: 30)
            another.send("GET /3 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            #expect(await another.read().text.hasSuffix("answer /3"))
            #expect(server.connectionsAccepted == 2)
        }
    }

    @Test func bodyLimitIsEnforced() async throws {
        let calls = Counter()
        let handler = ClosureHTTPHandler(synchronous: { request in
            calls.increment()
            return .text("\(request.body.count)")
        })
        try await withServer(handler: handler) { server in
            let atLimit = try await send("POST", "/", port: server.port, body: Data(repeating: 0x61, count: 65536))
            #expect(atLimit.status == 200)
            #expect(String(decoding: atLimit.body, as: UTF8.self) == "65536")
            #expect(calls.value == 1)

            let over = try await send("POST", "/", port: server.port, body: Data(repeating: 0x61, count: 65537))
            #expect(over.status == 413)
            #expect(calls.value == 1)

            // Chunked, so the size is only known while streaming.
            let client = try RawHTTPClient(port: server.port)
            client.send("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
            let chunk = Array(repeating: UInt8(0x62), count: 40000)
            for _ in 0..<2 {
                client.send(String(chunk.count, radix: 16) + "\r\n")
                client.send(chunk)
                client.send("\r\n")
            }
            client.send("0\r\n\r\n")
            let (text, _) = await client.read { $0.contains("\r\n\r\n") }
            #expect(text.hasPrefix("HTTP/1.1 413"))
            #expect(calls.value == 1)
        }
    }

    @Test func hugeContentLengthIsRejectedUpFront() async throws {
        let calls = Counter()
        let handler = ClosureHTTPHandler(synchronous: { _ in
            calls.increment()
            return .text("ok")
        })
        try await withServer(handler: handler) { server in
            // Nothing of the body is ever sent: the 413 can only come from the header alone.
            let client = try RawHTTPClient(port: server.port, receiveTimeout: 10)
            client.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000000\r\n\r\n")
            let (text, _) = await client.read { $0.contains("\r\n\r\n") }
            #expect(text.hasPrefix("HTTP/1.1 413"))
            #expect(calls.value == 0)
        }
    }

    @Test func stalledClientIsClosedAfterTimeout() async throws {
        try await withServer(connectionTimeout: .seconds(1), handler: Self.echo) { server in
            // The client's own receive bound is far beyond the server's 1 s: `.closed` then means
            // the server closed the connection, whatever the load on the machine.
            let stalled = try RawHTTPClient(port: server.port, receiveTimeout: 30)
            let started = ContinuousClock.now
            stalled.send("GET /stalled HTTP/1.1\r\nHost: x\r\nX-Half: ")

            // Others keep being served meanwhile.
            for _ in 0..<3 {
                let result = try await send("GET", "/other", port: server.port)
                #expect(result.status == 201)
            }
            let (text, end) = await stalled.read()
            let elapsed = ContinuousClock.now - started
            #expect(end == .closed)
            #expect(!text.contains("201"))
            #expect(elapsed >= .milliseconds(900), "not before the timeout")
        }
    }

    @Test func hundredConcurrentRequests() async throws {
        try await withServer(handler: Self.echo) { server in
            let port = server.port
            let statuses = try await withThrowingTaskGroup(of: Int.self) { group in
                for index in 0..<100 {
                    group.addTask { try await send("POST", "/n/\(index)", port: port, body: Data("\(index)".utf8)).status }
                }
                return try await group.reduce(into: [Int]()) { $0.append($1) }
            }
            #expect(statuses.count == 100)
            #expect(statuses.allSatisfy { $0 == 201 })
        }
    }

    @Test func stopWhileIdleIsPrompt() async throws {
        let server = HTTPServer(configuration: .init(host: "127.0.0.1", port: 0), handler: Self.echo)
        try server.start()
        _ = try await send("GET", "/", port: server.port)  // leaves a keep-alive connection open
        let started = ContinuousClock.now
        server.stop()
        #expect(ContinuousClock.now - started < .seconds(4))  // bounded, not instant: the grace is 5 s
        #expect(server.port == 0)
        server.stop()  // again: no-op
    }

    @Test func stopAnswersRequestsTheHandlerNeverDid() async throws {
        let arrived = Counter()
        let handler = ClosureHTTPHandler { _, _ in arrived.increment() }  // never responds
        let configuration = HTTPServer.Configuration(host: "127.0.0.1", port: 0, shutdownGracePeriod: .milliseconds(100))
        let server = HTTPServer(configuration: configuration, handler: handler)
        try server.start()
        let client = try RawHTTPClient(port: server.port)
        client.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        // Stop only once the handler holds the request: one the server never parsed gets no answer.
        try await waitUntil("the handler holds the request", timeout: .seconds(10)) { arrived.value == 1 }
        await Self.stop(server)
        let (text, _) = await client.read { $0.contains("\r\n\r\n") }
        #expect(text.hasPrefix("HTTP/1.1 503"))
    }

    @Test func startOnPortInUseThrows() async throws {
        try await withServer(handler: Self.echo) { server in
            let second = HTTPServer(configuration: .init(host: "127.0.0.1", port: server.port), handler: Self.echo)
            #expect {
                try second.start()
            } throws: { error in
                (error as? HTTPServerError)?.code == .addressInUse
                    && "\(error)".contains("address already in use")
            }
        }
    }

    @Test func badAddressThrows() {
        let server = HTTPServer(configuration: .init(host: "not an address", port: 0), handler: Self.echo)
        #expect {
            try server.start()
        } throws: { error in
            (error as? HTTPServerError)?.code == .invalidAddress
        }
    }
}

/// A thread-safe counter that escaping closures can capture.
final class Counter: Sendable {
    private let count = Atomic<Int>(0)
    func increment() { count.add(1, ordering: .sequentiallyConsistent) }
    var value: Int { count.load(ordering: .sequentiallyConsistent) }
}

/// Runs blocking work on a new thread: neither the cooperative pool nor Dispatch's (both sized
/// to the two cores here) may be held by one test while others run in parallel.
func onOwnThread<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { continuation in
        Thread.detachNewThread { continuation.resume(returning: body()) }
    }
}
