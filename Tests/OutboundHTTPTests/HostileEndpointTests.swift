#if canImport(Glibc)
    import Glibc
#endif
import Foundation
import OutboundHTTP
import ScriptedHTTPServer
import Testing
import TestTiming

/// The client against an endpoint that answers byte for byte as each test scripts it, over plain
/// HTTP and over real TLS (the test CA trusted as `SIWA_CA_FILE` would be): every shape an answer
/// may take is an answer or one `HTTPFailure`, never a crash, and no call holds more than 1 MiB.
/// No test asserts how long anything took; the suite's limit only turns a hang into a failure.
/// Bounds on a wait scale by `TestTimeScale` (the sanitizers' slowdown).
@Suite(.timeLimit(.minutes(TestTimeScale.scaled(minutes: 2)))) struct HostileEndpointTests {
    enum Scheme: String, CaseIterable, Sendable { case http, https }

    let client = HTTPClient(extraCertificatesPEM: TLSFixture.caPEM)

    func server(_ scheme: Scheme, _ script: @escaping @Sendable (Int) -> ScriptedHTTPServer.Reply) throws -> ScriptedHTTPServer {
        try ScriptedHTTPServer(tls: scheme == .https ? .localhost : nil, script: script)
    }

    func get(_ server: ScriptedHTTPServer, _ scheme: Scheme, host: String = "127.0.0.1", path: String = "/x",
             timeout: Duration = TestTimeScale.scaled(.seconds(20)), limit: HTTPBodyLimit = .whole(), client: HTTPClient? = nil)
        async -> Result<HTTPResponse, HTTPFailure>
    {
        let request = HTTPRequest(method: "GET", url: "\(scheme.rawValue)://\(host):\(server.port)\(path)", timeout: timeout, bodyLimit: limit)
        do { return .success(try await (client ?? self.client).send(request)) } catch { return .failure(error) }
    }

    func failureOf(_ result: Result<HTTPResponse, HTTPFailure>) -> HTTPFailure? {
        if case .failure(let failure) = result { return failure }
        return nil
    }

    @Test(arguments: Scheme.allCases) func aChunkedAnswerWithATrailerIsAnAnswer(_ scheme: Scheme) async throws {
        let server = try server(scheme) { _ in
            .answer("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n2\r\nok\r\n0\r\nX-Checksum: 1\r\n\r\n")
        }
        defer { server.stop() }
        let response = try await get(server, scheme).get()
        #expect(response.status == 200)
        #expect(response.body == Array("ok".utf8))
        #expect(response.headers["x-checksum"] == nil, "a trailer is read, never taken for a header")
    }

    @Test(arguments: Scheme.allCases) func chunkExtensionsAreSkipped(_ scheme: Scheme) async throws {
        let server = try server(scheme) { _ in
            .answer("HTTP/1.1 202 Accepted\r\nTransfer-Encoding: chunked\r\n\r\n5;name=value;x\r\nhello\r\n6;y=\"z\"\r\n world\r\n0;end\r\n\r\n")
        }
        defer { server.stop() }
        let response = try await get(server, scheme).get()
        #expect(response.status == 202)
        #expect(String(decoding: response.body, as: UTF8.self) == "hello world")
    }

    @Test(arguments: Scheme.allCases) func aHugeBodyStopsAtTheLimitAndIsNeverHeld(_ scheme: Scheme) async throws {
        let hundredMegabytes = 100 << 20
        let server = try server(scheme) { index in
            index % 2 == 0
                ? .endless(head: "HTTP/1.1 200 OK\r\nContent-Length: \(hundredMegabytes)\r\n\r\n", bodyBytes: hundredMegabytes)
                : .endless(head: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6400000\r\n", bodyBytes: hundredMegabytes)
        }
        defer { server.stop() }
        let before = try #require(heldKilobytes()), residentBefore = try #require(residentKilobytes())
        for limit in [HTTPBodyLimit.whole(), .prefix(512), .whole(atMost: 4096), .prefix(512)] {
            let failure = try #require(failureOf(await get(server, scheme, limit: limit)))
            #expect(failure.kind == .tooLarge)
            #expect(failure.status == 200, "the head had arrived: a webhook counts it")
        }
        let after = try #require(heldKilobytes()), residentAfter = try #require(residentKilobytes())
        print("hostile endpoint (\(scheme)): held grew \(after - before) kB, RSS \(residentAfter - residentBefore) kB")
        // Four 100 MB bodies: held, they would add 400 MB; read and dropped past 1 MiB, a few MB.
        #expect(after - before < 64 << 10, "held grew from \(before) kB to \(after) kB")
    }

    @Test(arguments: Scheme.allCases) func aLongerBodyKeepsItsPrefixAndTheConnection(_ scheme: Scheme) async throws {
        let long = String(repeating: "y", count: 3000)
        let server = try server(scheme) { _ in .answer("HTTP/1.1 500 Oops\r\nContent-Length: 3000\r\n\r\n\(long)") }
        defer { server.stop() }
        for _ in 0..<2 {
            let response = try await get(server, scheme, limit: .prefix(512)).get()
            #expect(response.status == 500)
            #expect(response.body.count == 512)
            #expect(response.bodyCut)
        }
        #expect(server.accepted == 1)
    }

    @Test(arguments: Scheme.allCases) func trickledBytesEndAtTheTimeout(_ scheme: Scheme) async throws {
        let trickled = Int(400 * TestTimeScale.factor)  // 16 s of body at normal speed
        let server = try server(scheme) { index in
            index == 0
                ? .trickle("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", interval: .milliseconds(400))
                : .trickle(String(repeating: "z", count: trickled), interval: .milliseconds(40),
                           afterHead: "HTTP/1.1 200 OK\r\nContent-Length: \(trickled)\r\n\r\n")
        }
        defer { server.stop() }
        let inHead = try #require(failureOf(await get(server, scheme, timeout: .seconds(1))))
        #expect(inHead.kind == .timeout)
        #expect(inHead.status == nil)
        // Long enough for a handshake on a loaded machine, far shorter than the 16 s of trickle
        // (both times `TestTimeScale`: under ThreadSanitizer 8 s did not see the head).
        let inBody = try #require(failureOf(await get(server, scheme, timeout: TestTimeScale.scaled(.seconds(8)))))
        #expect(inBody.kind == .timeout)
        #expect(inBody.status == 200)
    }

    @Test(arguments: Scheme.allCases) func aResetMidAnswerIsAFailure(_ scheme: Scheme) async throws {
        let server = try server(scheme) { index in
            index == 0
                ? .answerThenReset("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc")
                : .answerThenReset("HTTP/1.1 200 OK\r\nContent-Le")
        }
        defer { server.stop() }
        let midBody = try #require(failureOf(await get(server, scheme)))
        #expect(midBody.kind == .closed)
        #expect(midBody.status == 200)
        let midHead = try #require(failureOf(await get(server, scheme)))
        #expect(midHead.kind == .closed)
        #expect(midHead.status == nil, "the head never ended")
    }

    static let malformed = [
        "HTTP/1.1 2OO OK\r\nContent-Length: 0\r\n\r\n",
        "garbage, not HTTP\r\n\r\n",
        "HTTP/1.1 200 OK\r\nthis line has no colon\r\nContent-Length: 0\r\n\r\n",
        "HTTP/1.1 200 OK\r\nX-A: 1\r\n folded: continuation\r\nContent-Length: 0\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: twelve\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
    ]

    @Test(arguments: Scheme.allCases, malformed.indices) func aMalformedAnswerIsAFailure(_ scheme: Scheme, _ index: Int) async throws {
        let text = Self.malformed[index]
        let server = try server(scheme) { _ in .answer(text, thenClose: true) }
        defer { server.stop() }
        let result = await get(server, scheme)
        let failure = try #require(failureOf(result), "\(result)")
        #expect([.malformed, .closed].contains(failure.kind), "\(failure)")
    }

    @Test func aCertificateThatDoesNotVerifyIsATLSFailure() async throws {
        for (fixture, host, client) in [
            (TLSFixture.unknownCA, "127.0.0.1", client), (.wrongHost, "127.0.0.1", client), (.wrongHost, "localhost", client),
            (.localhost, "127.0.0.1", HTTPClient()),  // the test CA is in no system store
        ] {
            let server = try ScriptedHTTPServer(tls: fixture) { _ in .answer("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n") }
            defer { server.stop() }
            let failure = try #require(failureOf(await get(server, .https, host: host, client: client)))
            #expect(failure.kind == .tls, "\(fixture) at \(host): \(failure)")
            #expect(server.heads.isEmpty, "no request was sent")
        }
    }

    @Test func aHandshakeThatFailsIsATLSFailure() async throws {
        for greeting in ["HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", ""] {
            let server = try ScriptedHTTPServer(greeting: greeting) { _ in .silent }
            defer { server.stop() }
            let failure = try #require(failureOf(await get(server, .https)))
            #expect([.tls, .closed].contains(failure.kind), "\(failure)")
        }
    }

    @Test(arguments: Scheme.allCases) func aRedirectIsTheAnswerNeverFollowed(_ scheme: Scheme) async throws {
        let server = try server(scheme) { _ in
            .answer("HTTP/1.1 307 Temporary Redirect\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n")
        }
        defer { server.stop() }
        let response = try await get(server, scheme).get()
        #expect(response.status == 307)
        #expect(response.headers["location"] == "/elsewhere")
        #expect(server.heads.count == 1)
    }

    @Test func onlyHTTPAndHTTPSAreCalled() async throws {
        for url in ["ftp://127.0.0.1/x", "file:///etc/passwd", "gopher://127.0.0.1:70/", "dict://127.0.0.1/", "127.0.0.1:80", "http:///x"] {
            do {
                _ = try await client.send(HTTPRequest(method: "GET", url: url, timeout: TestTimeScale.scaled(.seconds(5))))
                Issue.record("\(url) was called")
            } catch {
                #expect(error.kind == .refusedURL, "\(url): \(error)")
            }
        }
    }

    @Test(arguments: Scheme.allCases) func connectionsAreReused(_ scheme: Scheme) async throws {
        let server = try server(scheme) { _ in .answer("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok") }
        defer { server.stop() }
        for _ in 0..<5 { #expect(try await get(server, scheme).get().status == 200) }
        #expect(server.accepted == 1)
        #expect(server.heads.count == 5)
    }

    /// A burst of calls, then calls one at a time, then another burst: the second burst finds the
    /// first's connections still open. curl's default cache kept 4 × the calls in flight, so each
    /// call of the quiet spell closed an idle connection and the next burst opened them again (over
    /// TLS a full handshake each: the webhook bench's https:// deliveries cost twice the CPU).
    @Test(arguments: Scheme.allCases) func aBurstsConnectionsOutlastAQuietSpell(_ scheme: Scheme) async throws {
        let burst = 8
        let ok = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        // Requests 0..<8 and 16..<24 wait for the gate, so each burst holds 8 connections at once.
        let server = try server(scheme) { index in index / burst == 1 ? .answer(ok) : .heldUntilGateOpens(ok) }
        defer { server.stop() }
        // A pool of its own: other tests' calls in flight would change what curl's default keeps.
        let client = HTTPClient.withOwnPool(extraCertificatesPEM: TLSFixture.caPEM)
        func callAtOnce(heldUntil requests: Int) async throws {
            try await withThrowingTaskGroup { group in
                for _ in 0..<burst { group.addTask { try await get(server, scheme, client: client).get() } }
                try await server.waitForRequests(requests)
                server.openGate()
                for try await response in group { #expect(response.status == 200) }
            }
            server.closeGate()
        }
        try await callAtOnce(heldUntil: burst)
        for _ in 0..<burst { #expect(try await get(server, scheme, client: client).get().status == 200) }
        try await callAtOnce(heldUntil: 3 * burst)
        #expect(server.mostHeldAtOnce == burst)
        #expect(server.heads.count == 3 * burst)
        #expect(server.accepted == burst, "connections opened for \(3 * burst) calls, at most \(burst) at once")
    }

    @Test func http2IsOfferedOverTLS() async throws {
        let server = try server(.https) { _ in .answer("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n") }
        defer { server.stop() }
        _ = try await get(server, .https).get()
        #expect(server.alpnOffers.first == ["h2", "http/1.1"])
    }

    @Test func anInterimContinueIsSkipped() async throws {
        let server = try server(.http) { _ in .answer("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\nX-A: b\r\n\r\n") }
        defer { server.stop() }
        let response = try await get(server, .http).get()
        #expect(response.status == 204)
        #expect(response.headers == ["x-a": "b"])
    }

    @Test func silenceIsATimeoutAndARefusalAConnectFailure() async throws {
        let server = try server(.http) { _ in .silent }
        defer { server.stop() }
        #expect(failureOf(await get(server, .http, timeout: .milliseconds(300)))?.kind == .timeout)
        let refusing = try RefusingPort()
        defer { refusing.release() }
        do {
            _ = try await client.send(HTTPRequest(method: "GET", url: "http://127.0.0.1:\(refusing.port)/", timeout: TestTimeScale.scaled(.seconds(5))))
            Issue.record("a refused port answered")
        } catch {
            #expect(error.kind == .connect, "\(error)")
        }
    }

    @Test func aCancelledCallEnds() async throws {
        let server = try server(.http) { _ in .silent }
        defer { server.stop() }
        let call = Task { await get(server, .http, timeout: TestTimeScale.scaled(.seconds(60))) }
        try await server.waitForRequests(1)
        call.cancel()
        #expect(failureOf(await call.value)?.kind == .cancelled)
    }
}

/// What this process holds, in kB: its resident memory (VmRSS), or under a sanitizer its
/// allocator's live heap (`__sanitizer_get_current_allocated_bytes`). AddressSanitizer keeps freed
/// blocks resident in its quarantine (256 MB by default) so that a use after free is caught, so its
/// RSS grows with every free of every test in the process (130 MB during this one's four calls)
/// and says nothing of what the client kept.
func heldKilobytes() -> Int? {
    if let liveHeapBytes = sanitizerLiveHeapBytes { return liveHeapBytes() / 1024 }
    return residentKilobytes()
}

/// The sanitizer runtime's count of allocated, not yet freed bytes; nil without a sanitizer.
private let sanitizerLiveHeapBytes: (@convention(c) () -> Int)? = {
    // A null handle is glibc's RTLD_DEFAULT: the executable and every library loaded.
    guard let symbol = dlsym(nil, "__sanitizer_get_current_allocated_bytes") else { return nil }
    return unsafeBitCast(symbol, to: (@convention(c) () -> Int).self)
}()

/// This process's resident memory (VmRSS), in kB.
private func residentKilobytes() -> Int? {
    guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return nil }
    for line in status.split(separator: "\n") where line.hasPrefix("VmRSS:") {
        return Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "")
    }
    return nil
}
