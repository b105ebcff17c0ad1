#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif
import Foundation
import LoopbackHTTP
import ScriptedHTTPServer
import Testing

/// The HTTP/1.1 client of our own against a server that answers byte for byte as each test scripts
/// it: the answer shapes a server may send (length, chunked, to the end of the stream, an interim
/// 100), the body limit, keep-alive and its end, and the failures that must read as failures.
/// Every wait is bounded by the deadline each test passes; none asserts how long anything took
/// (the suite's time limit only turns a client that ignored its deadline into a failure, not a hang).
@Suite(.timeLimit(.minutes(1))) struct LoopbackHTTPClientTests {
    func client(_ server: ScriptedHTTPServer, path: String = "/hooks/siwa?key=k%20v", keptBodyBytes: Int = 1 << 20) throws
        -> LoopbackHTTPClient
    {
        let url = try #require(URL(string: "http://127.0.0.1:\(server.port)\(path)"))
        return try #require(LoopbackHTTPClient(url: url, keptBodyBytes: keptBodyBytes))
    }

    func post(_ client: LoopbackHTTPClient, _ body: String = "{}", to target: String? = nil, headers: [(String, String)] = [],
              within timeout: Duration = .seconds(10)) throws -> LoopbackHTTPAnswer
    {
        try client.post(Array(body.utf8), to: target, headers: headers, deadline: .now + timeout)
    }

    func answer(_ status: Int, _ body: String, _ end: LoopbackHTTPAnswer.BodyEnd = .whole) -> LoopbackHTTPAnswer {
        LoopbackHTTPAnswer(status: status, body: Array(body.utf8), bodyEnd: end)
    }

    @Test func lengthAnswersKeepTheConnection() throws {
        let server = try ScriptedHTTPServer { _ in .answer("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello") }
        defer { server.stop() }
        let client = try client(server)
        #expect(try post(client, headers: [("Authorization", "Bearer t")]) == answer(200, "hello"))
        #expect(try post(client, to: "/v1/sign-in") == answer(200, "hello"))
        #expect(try post(client) == answer(200, "hello"))
        #expect(server.accepted == 1)
        let heads = server.heads
        #expect(heads[0].hasPrefix("POST /hooks/siwa?key=k%20v HTTP/1.1\r\n"))
        #expect(heads[0].lowercased().contains("\r\nhost: 127.0.0.1:\(server.port)\r\n"))
        #expect(heads[0].lowercased().contains("\r\ncontent-type: application/json\r\n"))
        #expect(heads[0].contains("\r\nAuthorization: Bearer t\r\n"))
        #expect(heads[1].hasPrefix("POST /v1/sign-in HTTP/1.1\r\n"))
        #expect(server.bodies == ["{}", "{}", "{}"])
    }

    @Test func aBodyLongerThanKeptIsCutToItsPrefixAndTheConnectionStillServes() throws {
        let long = String(repeating: "x", count: 3000)
        let server = try ScriptedHTTPServer { _ in .answer("HTTP/1.1 500 Oops\r\nContent-Length: 3000\r\n\r\n\(long)") }
        defer { server.stop() }
        let prefixOnly = try client(server, keptBodyBytes: 512)
        #expect(try post(prefixOnly) == answer(500, String(long.prefix(512)), .longerThanKept))
        #expect(try post(prefixOnly) == answer(500, String(long.prefix(512)), .longerThanKept))
        #expect(try post(try client(server)) == answer(500, long))
        #expect(server.accepted == 2, "the long body was read to its end, so the first connection served twice")
    }

    @Test func chunkedAnswersWithExtensionsAndTrailersAreReadToTheirEnd() throws {
        let server = try ScriptedHTTPServer { _ in
            .answer("HTTP/1.1 202 Accepted\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: t\r\n\r\n")
        }
        defer { server.stop() }
        let client = try client(server)
        #expect(try post(client) == answer(202, "hello world"))
        #expect(try post(client) == answer(202, "hello world"))
        #expect(server.accepted == 1)
        #expect(try post(try self.client(server, keptBodyBytes: 7)) == answer(202, "hello w", .longerThanKept))
    }

    @Test func aBodyToTheEndOfTheStreamIsReadAndTheNextRequestGoesOnANewConnection() throws {
        let server = try ScriptedHTTPServer { _ in .answer("HTTP/1.0 500 Internal Server Error\r\n\r\nbroken", thenClose: true) }
        defer { server.stop() }
        let client = try client(server)
        #expect(try post(client) == answer(500, "broken"))
        #expect(try post(client) == answer(500, "broken"))
        #expect(server.accepted == 2)
        #expect(try post(try self.client(server, keptBodyBytes: 3)) == answer(500, "bro", .longerThanKept))
    }

    @Test func anAnnouncedCloseIsHonoured() throws {
        let server = try ScriptedHTTPServer { _ in .answer("HTTP/1.1 201 Created\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok") }
        defer { server.stop() }
        let client = try client(server)
        #expect(try post(client) == answer(201, "ok"))
        #expect(try post(client) == answer(201, "ok"))
        #expect(server.accepted == 2)
        #expect(server.heads.count == 2, "each request was sent once")
    }

    @Test func aServerThatClosesMidBodyGivesACutShortBody() throws {
        let server = try ScriptedHTTPServer { index in
            index == 0
                ? .answer("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabcd", thenClose: true)
                : .answer("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nef", thenClose: true)
        }
        defer { server.stop() }
        let client = try client(server)
        #expect(try post(client) == answer(200, "abcd", .cutShort))
        #expect(try post(client) == answer(200, "ef", .cutShort))
        #expect(server.heads.count == 2, "an answered request is never sent again")
    }

    @Test func aServerThatClosesMidHeadIsAConnectionFailureNotARetry() throws {
        let server = try ScriptedHTTPServer { index in
            index == 0 ? .answer("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n") : .answer("HTTP/1.1 200 OK\r\nContent-", thenClose: true)
        }
        defer { server.stop() }
        let client = try client(server)
        #expect(try post(client) == answer(200, ""))
        #expect {
            _ = try post(client)
        } throws: { error in
            guard case .connection(operation: "recv", code: nil, bytesReceived: let received) = error as? LoopbackHTTPFailure else { return false }
            return received > 0 && "\(error)" == "recv: closed by the endpoint"
        }
        #expect(server.heads.count == 2, "something was answered, so the request was not sent again")
    }

    @Test func aKeptConnectionThatDiesUnansweredIsRetriedOnceOnAFreshOne() async throws {
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
        let client = try client(server)
        #expect(try post(client) == answer(200, ""))
        #expect(try post(client) == answer(201, ""))
        #expect(server.accepted == 2)
        try await server.waitForClosed(2)
        #expect(throws: LoopbackHTTPFailure.self) { try post(client) }
        #expect(server.heads.count == 4)
    }

    @Test func anInterimContinueIsSkippedAndARedirectIsTheAnswer() throws {
        let server = try ScriptedHTTPServer { index in
            index == 0
                ? .answer("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n")
                : .answer("HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n")
        }
        defer { server.stop() }
        let client = try client(server)
        #expect(try post(client) == answer(204, ""))
        #expect(try post(client) == answer(302, ""))
        #expect(server.heads.count == 2, "the redirect was not followed")
    }

    @Test func everyWaitEndsAtTheDeadline() throws {
        // No answer at all; a head and part of a body; part of a chunk: the server keeps each
        // connection open, so only the deadline ends the wait.
        let server = try ScriptedHTTPServer { index in
            switch index {
            case 0: .silent
            case 1: .answer("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nab")
            default: .answer("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nab")
            }
        }
        defer { server.stop() }
        for _ in 0..<3 {
            #expect {
                _ = try post(try client(server), within: .milliseconds(300))
            } throws: { error in
                guard case .timedOut = error as? LoopbackHTTPFailure else { return false }
                return true
            }
        }
        #expect(server.heads.count == 3)
    }

    @Test func aRefusedConnectionIsAConnectFailure() throws {
        let refusing = RefusingPort()
        defer { refusing.close() }
        let url = try #require(URL(string: "http://localhost:\(refusing.port)/x"))
        let client = try #require(LoopbackHTTPClient(url: url, keptBodyBytes: 512))
        #expect {
            _ = try post(client)
        } throws: { error in
            guard case .connection(operation: "connect", code: let code?, bytesReceived: 0) = error as? LoopbackHTTPFailure else { return false }
            return code == ECONNREFUSED || code == EADDRNOTAVAIL
        }
    }

    @Test func localhostIsReached() throws {
        let server = try ScriptedHTTPServer { _ in .answer("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n") }
        defer { server.stop() }
        let url = try #require(URL(string: "http://localhost:\(server.port)/hooks"))
        let client = try #require(LoopbackHTTPClient(url: url, keptBodyBytes: 0))
        #expect(try post(client) == answer(200, ""))
        #expect(server.heads.first?.lowercased().contains("\r\nhost: localhost:\(server.port)\r\n") == true)
    }

    @Test func onlyLoopbackHTTPIsSpokenTo() throws {
        for (text, direct) in [
            ("http://127.0.0.1:9/x", true), ("http://localhost/x", true), ("http://[::1]:8080/", true), ("http://127.1.2.3:9/", true),
            ("https://127.0.0.1:9/x", false), ("http://10.0.0.1/x", false), ("http://example.com/x", false),
        ] {
            let url = try #require(URL(string: text))
            #expect((LoopbackHTTPClient(url: url, keptBodyBytes: 512) != nil) == direct, "\(text)")
        }
    }

}
