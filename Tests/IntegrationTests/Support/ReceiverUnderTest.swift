import Foundation
import TestTiming

/// A real `siwa-receiver` process for a test: started against a database with `TestAppleKeys` as
/// Apple's key endpoint, on a port of its own.
enum ReceiverUnderTest {
    /// The receiver and its base URL once it is ready (`/readyz` 200).
    static func start(
        databaseURL: String, keys: TestAppleKeys, extra: [String: String] = [:]
    ) async throws -> (ServiceProcess, String) {
        let (receiver, base) = try await listening(databaseURL: databaseURL, keys: keys, extra: extra)
        try await waitForReadiness(base, 200, receiver: receiver)
        return (receiver, base)
    }

    /// The receiver and its base URL once it listens, ready or not (a test of a database that
    /// refuses to store: it may rightly never be ready).
    static func listening(
        databaseURL: String, keys: TestAppleKeys, extra: [String: String] = [:]
    ) async throws -> (ServiceProcess, String) {
        let environment = [
            "DATABASE_URL": databaseURL, "SIWA_CLIENT_IDS": "com.example.app,com.example.app.web",
            "SIWA_LISTEN": "127.0.0.1:0", "SIWA_APPLE_BASE_URL": keys.baseURL, "SIWA_LOG_LEVEL": "debug",
        ].merging(extra) { _, new in new }
        let receiver = try ServiceProcess("siwa-receiver", environment: environment)
        return (receiver, "http://127.0.0.1:\(try await receiver.boundHTTPPort())")
    }

    /// Polls `/readyz` until it answers `status`; fails at once, with the log, if the receiver exits.
    static func waitForReadiness(_ base: String, _ status: Int, receiver: ServiceProcess) async throws {
        try await waitUntil("/readyz answers \(status)", detail: receiver.log) {
            if let (got, _) = try? await HTTP.request("GET", base + "/readyz"), got == status { return true }
            guard receiver.isRunning else {
                throw ServiceProcessError(message: "the receiver exited before /readyz answered \(status):\n\(receiver.log)")
            }
            return false
        }
    }
}
