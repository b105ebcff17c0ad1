import Foundation
import OutboundHTTP
import ScriptedHTTPServer
import TestTiming
import Testing

/// What `https://` calls trust, and what a failed call's description may hold. The calls' bounds
/// and the suite's limit scale by `TestTimeScale` (the sanitizers).
@Suite(.timeLimit(.minutes(TestTimeScale.scaled(minutes: 2)))) struct TrustAndSecretsTests {
    static let systemStandIn = TLSFixture.directory.appendingPathComponent("system").path

    func call(_ client: HTTPClient, _ server: ScriptedHTTPServer) async -> Result<HTTPResponse, HTTPFailure> {
        do {
            return .success(try await client.send(HTTPRequest(method: "GET", url: "https://127.0.0.1:\(server.port)/", timeout: TestTimeScale.scaled(.seconds(20)))))
        } catch { return .failure(error) }
    }

    @Test func extraCertificatesAreTrustedBesidesTheSystemStore() async throws {
        let server = try ScriptedHTTPServer(tls: .localhost) { _ in .answer("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n") }
        defer { server.stop() }
        // The private CA alone (SIWA_CA_FILE) verifies the server.
        #expect(try await call(HTTPClient(extraCertificatesPEM: TLSFixture.caPEM), server).get().status == 200)
        // A system store holding the CA verifies it with no extra certificates, and still does when
        // extra certificates (here an unrelated one) are given: they add to the store, never replace it.
        #expect(try await call(HTTPClient(extraCertificatesPEM: nil, systemDirectory: Self.systemStandIn), server).get().status == 200)
        let unrelated = try String(contentsOf: TLSFixture.directory.appendingPathComponent("unknown-ca.pem"), encoding: .utf8)
        #expect(try await call(HTTPClient(extraCertificatesPEM: unrelated, systemDirectory: Self.systemStandIn), server).get().status == 200)
        // Neither: refused.
        let failure = try #require(await call(HTTPClient(extraCertificatesPEM: unrelated), server).failed)
        #expect(failure.kind == .tls)
    }

    @Test func aFailedCallsDescriptionHoldsNoSecret() async throws {
        let bearer = "bearer-secret-7f3a9c"
        let clientSecret = "client-secret-b41e02"
        let replies: [ScriptedHTTPServer.Reply] = [
            .answerThenReset("HTTP/1.1 200 OK\r\nContent-Le"), .answer("HTTP/1.1 2OO\r\n\r\n", thenClose: true),
            .answer("HTTP/1.1 200 OK\r\nno colon\r\n\r\n"), .silent, .closeWithoutAnswer,
            .endless(head: "HTTP/1.1 200 OK\r\n\r\n", bodyBytes: 4 << 20),
        ]
        for tls in [nil, TLSFixture.localhost, .unknownCA] {
            let server = try ScriptedHTTPServer(tls: tls) { replies[$0 % replies.count] }
            defer { server.stop() }
            for _ in replies {
                let request = HTTPRequest(
                    method: "POST", url: "\(tls == nil ? "http" : "https")://127.0.0.1:\(server.port)/auth/token?code=query-secret-55",
                    headers: [("Authorization", "Bearer \(bearer)"), ("Content-Type", "application/x-www-form-urlencoded")],
                    // Each failure its own (not a timeout) also under a sanitizer's slowdown.
                    body: Array("client_secret=\(clientSecret)&grant_type=refresh_token".utf8), timeout: TestTimeScale.scaled(.seconds(3)))
                do {
                    _ = try await HTTPClient(extraCertificatesPEM: TLSFixture.caPEM).send(request)
                    Issue.record("a hostile answer was taken for an answer")
                } catch {
                    for secret in [bearer, clientSecret, "query-secret-55", "auth/token"] {
                        #expect(!error.description.contains(secret), "\(error)")
                    }
                }
            }
        }
    }
}

extension Result {
    var failed: Failure? {
        if case .failure(let failure) = self { return failure }
        return nil
    }
}
