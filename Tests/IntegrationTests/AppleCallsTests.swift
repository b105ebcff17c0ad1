import AppleClient
import Foundation
import HTTPServer
import Logging
import Postgres
import TestTiming
import Testing

/// What the worker's calls to Apple will not do: follow a redirect with a secret in the body, or
/// start quietly with a team signing key anyone on the machine can read.
@Suite("Calls to Apple")
struct AppleCallsTests {
    @Test func redirectsAreNotFollowed() async throws {
        // "Apple" answers every call with a 307 to another host; that host must never see the form.
        let elsewhereHits = LockedBox(0)
        let elsewhere = HTTPServer(
            configuration: .init(host: "127.0.0.1", port: 0, threadCount: 1),
            handler: ClosureHTTPHandler(synchronous: { _ in
                elsewhereHits.withValue { $0 += 1 }
                return .json(#"{"status":"got it"}"#)
            }))
        try elsewhere.start()
        defer { elsewhere.stop() }
        let location = "http://127.0.0.1:\(elsewhere.port)/steal"
        let apple = HTTPServer(
            configuration: .init(host: "127.0.0.1", port: 0, threadCount: 1),
            handler: ClosureHTTPHandler(synchronous: { _ in
                HTTPResponse(status: 307, headers: [("Location", location)], body: [])
            }))
        try apple.start()
        defer { apple.stop() }

        let http = AppleHTTP(baseURL: URL(string: "http://127.0.0.1:\(apple.port)")!, timeout: TestTimeScale.scaled(.seconds(5)))
        let revoke = try await http.postForm(
            "auth/revoke", fields: [("client_id", "com.example.app"), ("client_secret", "s"), ("token", "t")])
        #expect(revoke.status == 307)
        let keys = try await http.get("auth/keys")
        #expect(keys.status == 307)
        #expect(elsewhereHits.value == 0)
    }

    @Test func keyFileReadableByOthersIsWarnedAboutAtStart() async throws {
        try await withMigratedDatabase { database in
            try await withTeardown { teardown in
                let apple = try FakeAppleForWorkers(stoppedBy: teardown)
                let keyPath = try #require(apple.environment["SIWA_PRIVATE_KEY_FILE"])
                var environment = apple.environment.merging([
                    "DATABASE_URL": database.url, "SIWA_CLIENT_IDS": FakeAppleForWorkers.clientID,
                    "SIWA_OPS_LISTEN": "127.0.0.1:0", "SIWA_LOG_LEVEL": "info",
                ]) { _, new in new }
                environment["SIWA_LISTEN_NOTIFY"] = "false"

                func startupLog(mode: Int) async throws -> String {
                    try FileManager.default.setAttributes([.posixPermissions: mode], ofItemAtPath: keyPath)
                    let worker = try ServiceProcess("siwa-worker", environment: environment)
                    _ = try await worker.boundHTTPPort()
                    await worker.stop()
                    return worker.log
                }
                let shared = try await startupLog(mode: 0o644)
                let warning = shared.split(separator: "\n").first { $0.contains("SIWA_PRIVATE_KEY_FILE is readable by group or others") }
                #expect(warning?.contains(#""level":"warn""#) == true, "\(shared)")
                #expect(warning?.contains(#""file":"\#(keyPath)""#) == true, "\(shared)")
                #expect(!(try await startupLog(mode: 0o600)).contains("readable by group or others"))
            }
        }
    }
}
