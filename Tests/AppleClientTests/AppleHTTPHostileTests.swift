import AppleClient
import Foundation
import ScriptedHTTPServer
import TestTiming
import Testing

/// Apple's calls (keys, token, revoke, migration) against a stand-in that answers byte for byte as
/// each test scripts it, over real TLS with the test CA trusted as `SIWA_CA_FILE` would: a chunked
/// answer with a trailer is an answer; everything broken is an `AppleTransportError` (retried by
/// the callers), never a crash, and its description holds no secret the call sent. The calls'
/// bound, the trickle's pace and the suite's limit scale by `TestTimeScale` (the sanitizers).
@Suite(.timeLimit(.minutes(TestTimeScale.scaled(minutes: 2)))) struct AppleHTTPHostileTests {
    func http(_ server: ScriptedHTTPServer, fixtureCA: Bool = true) throws -> AppleHTTP {
        AppleHTTP(baseURL: try #require(URL(string: "https://127.0.0.1:\(server.port)")), timeout: TestTimeScale.scaled(.seconds(8)),
                  caCertificates: fixtureCA ? TLSFixture.caPEM : nil)
    }

    @Test func aKeyFetchAnsweredChunkedWithATrailerIsAnAnswer() async throws {
        let keys = #"{"keys":[]}"#
        let server = try ScriptedHTTPServer(tls: .localhost) { _ in
            .answer("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nCache-Control: max-age=60\r\n\r\n\(String(keys.utf8.count, radix: 16));ext=1\r\n\(keys)\r\n0\r\nX-Trailer: 1\r\n\r\n")
        }
        defer { server.stop() }
        let response = try await http(server).get("auth/keys")
        #expect(response.status == 200)
        #expect(String(decoding: response.body, as: UTF8.self) == keys)
        #expect(response.headers["cache-control"] == "max-age=60")
        #expect(server.heads.first?.hasPrefix("GET /auth/keys HTTP/1.1\r\n") == true)
    }

    @Test func aRedirectIsHandedBackNotFollowed() async throws {
        let server = try ScriptedHTTPServer(tls: .localhost) { _ in
            .answer("HTTP/1.1 307 Temporary Redirect\r\nLocation: https://elsewhere.example/auth/token\r\nContent-Length: 0\r\n\r\n")
        }
        defer { server.stop() }
        let response = try await http(server).postForm("auth/token", fields: [("client_secret", "s")])
        #expect(response.status == 307)
        #expect(server.heads.count == 1)
    }

    static let broken: [ScriptedHTTPServer.Reply] = [
        .endless(head: "HTTP/1.1 200 OK\r\nContent-Length: 104857600\r\n\r\n", bodyBytes: 100 << 20),
        .answerThenReset("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"access_token\":"),
        .answerThenReset("HTTP/1.1 200 OK\r\nContent-"),
        .answer("HTTP/1.1 2OO OK\r\nContent-Length: 0\r\n\r\n", thenClose: true),
        .answer("HTTP/1.1 200 OK\r\nnot a header\r\nContent-Length: 0\r\n\r\n", thenClose: true),
        .answer("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nqq\r\n", thenClose: true),
        // 41 s of trickle against the 8 s bound (both scaled, or at x8 the trickle would end first).
        .trickle("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", interval: TestTimeScale.scaled(.seconds(1))),
        .silent, .closeWithoutAnswer,
    ]

    @Test(arguments: broken.indices) func aBrokenAnswerIsATransportErrorWithoutSecrets(_ index: Int) async throws {
        let reply = Self.broken[index]
        let server = try ScriptedHTTPServer(tls: .localhost) { _ in reply }
        defer { server.stop() }
        do {
            let response = try await http(server).postForm(
                "auth/usermigrationinfo", fields: [("client_secret", "eyJ.client-secret-9d1f"), ("sub", "001.sub")],
                bearer: "access-token-bearer-52c0")
            Issue.record("a broken answer was taken for \(response.status)")
        } catch let error as AppleTransportError {
            for secret in ["client-secret-9d1f", "access-token-bearer-52c0", "001.sub"] {
                #expect(!error.description.contains(secret), "\(error)")
            }
        }
    }

    @Test func aCertificateThatDoesNotVerifyIsATransportError() async throws {
        for (fixture, trusted) in [(TLSFixture.unknownCA, true), (.wrongHost, true), (.localhost, false)] {
            let server = try ScriptedHTTPServer(tls: fixture) { _ in .answer("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}") }
            defer { server.stop() }
            await #expect(throws: AppleTransportError.self, "\(fixture)") {
                _ = try await http(server, fixtureCA: trusted).postForm("auth/revoke", fields: [("token", "refresh-token")])
            }
            #expect(server.heads.isEmpty, "no byte of the form was sent")
        }
    }
}
