import AppleClient
import FakeApple
import Foundation
import Testing
import TestTiming

#if canImport(Glibc)
    import Glibc
#endif

/// Sources/AppAPI/README.md, "The edge": the 5 s key wait, and calls to this machine never through a proxy.
@Suite("App API edge: the key wait and proxies")
struct AppAPIEdgeCallsTests {
    /// Apple's key endpoint never answers: a sign-in that needs a key waits at most 5 s for it,
    /// then 503 `keys_unavailable` (the worker's Apple calls are bounded at 10 s).
    @Test func aSignInWaitsAtMostFiveSecondsForApplesKeys() async throws {
        try await AppAPIEdgeTests().withAppAPIWorker(prepare: { $0.fake.closeGate(endpoint: "keys", after: 0) }) { served in
            defer { served.apple.fake.openGate(endpoint: "keys") }
            let issued = try await HTTP.request("POST", served.api + "/v1/nonces", bearer: AppAPIEdgeTests.token).body
            let nonce = try #require((try JSONSerialization.jsonObject(with: Data(issued.utf8)) as? [String: Any])?["nonce"] as? String)
            let token = served.apple.fake.issueIdentityToken(
                clientID: FakeAppleForWorkers.clientID, sub: "key-wait", nonce: IdentityTokenVerifier.nonceClaim(rawNonce: nonce),
                email: nil, isPrivateEmail: nil
            ).identityToken
            let body = try JSONSerialization.data(withJSONObject: [
                "client_id": FakeAppleForWorkers.clientID, "identity_token": token, "nonce": nonce,
            ])
            // Timed by curl itself (`time_total`), not by this process: with a hundred suites beside
            // it, the resumption of an awaiting test task was once late enough to read a 5 s wait as 8.5 s.
            let run = try await curl([
                "-X", "POST", served.api + "/v1/sign-in", "-H", "Authorization: Bearer \(AppAPIEdgeTests.token)",
                "-H", "Content-Type: application/json", "--data-binary", String(decoding: body, as: UTF8.self),
                "-w", "\n%{http_code} %{time_total}",
            ])
            let lines = run.stdout.split(separator: "\n")
            let timing = lines.last?.split(separator: " ") ?? []
            let status = timing.first.flatMap { Int($0) }
            let waited = timing.last.flatMap { Double($0) }.map { Duration.milliseconds(Int($0 * 1000)) }
            #expect(run.status == 0 && status == 503 && run.stdout.contains("keys_unavailable"), "\(run)")
            #expect(waited.map { $0 <= .seconds(5) + TestTimeScale.scaled(.milliseconds(700)) } == true, "waited \(String(describing: waited))")
        }
    }

    /// With every proxy variable pointing at a listener of ours, the worker's calls to the fake Apple
    /// on 127.0.0.1 (its key set, fetched at start) go straight there: the listener sees nothing.
    @Test func callsToThisMachineNeverGoThroughAProxy() async throws {
        let proxy = try CountingListener()
        defer { proxy.close() }
        let url = "http://127.0.0.1:\(proxy.port)"
        try await AppAPIEdgeTests().withAppAPIWorker(["http_proxy": url, "HTTPS_PROXY": url, "https_proxy": url, "ALL_PROXY": url]) { served in
            _ = try await served.worker.firstLogLine("its key set loaded") { $0.contains("Apple key set loaded") ? true : nil }
            #expect(proxy.accepted() == 0)
        }
    }

    /// A proxy that is not http(s) (SOCKS) is refused at start, naming the variable.
    @Test func aProxyOtherThanHTTPIsRefusedAtStart() async throws {
        let refused = try await Siwa.run(["status"], environment: ["DATABASE_URL": "postgresql://127.0.0.1:1/x", "ALL_PROXY": "socks5h://127.0.0.1:1080"])
        #expect(refused.status == 2 && refused.stderr.contains("ALL_PROXY"), "\(refused.stderr)")
        try await withMigratedDatabase { database in
            let worker = try database.startWorker(["https_proxy": "socks4://127.0.0.1:1080"])
            let status = await worker.waitForExit(timeout: .seconds(30))
            if status == nil { await worker.stop() }
            #expect(status == 2 && worker.log.contains("https_proxy"), "\(worker.log)")
        }
    }
}

/// A listening socket on 127.0.0.1 that counts the connections made to it (and closes them).
final class CountingListener: @unchecked Sendable {
    // @unchecked: used from the test's own task only.
    private let socket: Int32
    let port: Int
    private var count = 0

    init() throws {
        let socket = Glibc.socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        self.socket = socket
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        inet_pton(AF_INET, "127.0.0.1", &address.sin_addr)
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(socket, $0, length) } }
        guard bound == 0, listen(socket, 64) == 0 else { throw ServiceProcessError(message: "cannot listen: errno \(errno)") }
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(socket, $0, &length) } }
        port = Int(UInt16(bigEndian: address.sin_port))
    }

    /// Connections accepted so far.
    func accepted() -> Int {
        while true {
            let client = accept(socket, nil, nil)
            guard client >= 0 else { return count }
            count += 1
            Glibc.close(client)
        }
    }

    func close() { Glibc.close(socket) }
}
