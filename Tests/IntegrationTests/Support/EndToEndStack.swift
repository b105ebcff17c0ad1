import CryptoCore
import FakeApple
import Foundation
import Postgres
import TestTiming


/// The whole stack as real processes: `siwa fake-apple` (checking client_secret signatures against a
/// fresh `.p8`), `siwa-receiver` and `siwa-worker` pointed at it, over a migrated database. Every
/// process logs at debug level into a file the test reads afterwards (secret-free logs).
/// `appleOverTLS`: the fake serves `https://` with a certificate from a throwaway CA, which the
/// receiver and worker trust through `SIWA_CA_FILE` (the path that talks to the real Apple).
final class EndToEndStack: @unchecked Sendable {
    // @unchecked: touched only from the test's own task.
    static let clientID = "com.example.app"
    static let teamID = "E2ETEAM001"
    static let keyID = "E2EKEY0001"
    /// On: the end-to-end tests take the path that talks to the real Apple (https, certificates
    /// verified against `SIWA_CA_FILE`); a test passes `appleOverTLS: false` for plain http.
    static let appleOverTLSByDefault = true

    let database: MigratedDatabase
    let directory: URL
    let tokenKeys: String
    let fake: ServiceProcess
    let fakeURL: String
    let receiver: ServiceProcess
    let receiverURL: String
    let worker: ServiceProcess
    /// The throwaway CA's certificate file when the fake serves `https://`.
    let caFile: String?

    var endpoint: String { receiverURL + "/apple/notifications" }
    /// What a `siwa` command run against this stack needs to trust its fake Apple.
    var trustEnvironment: [String: String] { caFile.map { ["SIWA_CA_FILE": $0] } ?? [:] }
    var processes: [ServiceProcess] { [fake, receiver, worker] }

    init(
        database: MigratedDatabase, workerSettings: [String: String] = [:], appleOverTLS: Bool = EndToEndStack.appleOverTLSByDefault
    ) async throws {
        self.database = database
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("siwa-e2e-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let keyPath = try TestSecrets.SigningKey(fileName: "AuthKey_\(Self.keyID).p8", in: directory).path
        tokenKeys = TestSecrets.tokenKeys(["e2e1"])
        let tls = appleOverTLS ? try TestCertificates(in: directory) : nil
        caFile = tls?.caFile
        let trust = tls.map { ["SIWA_CA_FILE": $0.caFile] } ?? [:]

        fake = try ServiceProcess(
            "siwa",
            arguments: [
                "fake-apple", "--listen", "127.0.0.1:0", "--verify-key-file", keyPath, "--team-id", Self.teamID,
            ] + (tls?.serverArguments ?? []),
            environment: ["SIWA_LOG_LEVEL": "debug"])
        fakeURL = try await Self.waitForListening(fake)

        receiver = try ServiceProcess(
            "siwa-receiver",
            environment: [
                "DATABASE_URL": database.url, "SIWA_CLIENT_IDS": Self.clientID, "SIWA_LISTEN": "127.0.0.1:0",
                "SIWA_APPLE_BASE_URL": fakeURL, "SIWA_LOG_LEVEL": "debug",
            ].merging(trust) { $1 })
        receiverURL = "http://127.0.0.1:\(try await receiver.boundHTTPPort())"
        worker = try ServiceProcess(
            "siwa-worker",
            environment: [
                "DATABASE_URL": database.url, "SIWA_CLIENT_IDS": Self.clientID, "SIWA_APPLE_BASE_URL": fakeURL,
                "SIWA_TEAM_ID": Self.teamID, "SIWA_KEY_ID": Self.keyID, "SIWA_PRIVATE_KEY_FILE": keyPath,
                "SIWA_TOKEN_KEYS": tokenKeys, "SIWA_OPS_LISTEN": "127.0.0.1:0", "SIWA_LOG_LEVEL": "debug",
                "SIWA_POLL_INTERVAL": "200ms", "SIWA_RETRY_BASE": "100ms", "SIWA_PAUSE_PROBE_INTERVAL": "1s",
                "SIWA_SHUTDOWN_GRACE": "2s",
            ].merging(trust) { $1 }.merging(workerSettings) { $1 })
        try await waitForReceiver()
    }

    /// The base URL from the `fake-apple listening on http(s)://...` line.
    /// Bounded like `ServiceProcess.boundHTTPPort`: a last look after the deadline, 60 s.
    static func waitForListening(_ process: ServiceProcess, timeout: Duration = .seconds(60)) async throws -> String {
        try await process.firstLogLine("a listening line", timeout: timeout) { line in
            line.range(of: #"listening on https?://[0-9.]+:[0-9]+"#, options: .regularExpression)
                .map { String(line[$0].dropFirst("listening on ".count)) }
        }
    }

    private func waitForReceiver() async throws {
        try await waitUntil("the receiver is ready", every: .milliseconds(50), detail: receiver.log) {
            if let (status, _) = try? await HTTP.request("GET", receiverURL + "/readyz"), status == 200 { return true }
            for process in [receiver, worker] where !process.isRunning {
                throw ServiceProcessError(message: "\(process.name) exited during start-up:\n\(process.log)")
            }
            return false
        }
    }

    /// SIGTERM to each (worker first), then the key folder goes.
    func stop() async {
        for process in [worker, receiver, fake] { await process.stop() }
        try? FileManager.default.removeItem(at: directory)
    }

    // MARK: The fake's admin endpoints

    func code(sub: String, email: String? = nil) async throws -> String {
        var object: [String: Any] = ["client_id": Self.clientID, "sub": sub]
        if let email { object["email"] = email; object["is_private_email"] = true }
        let (status, body) = try await HTTP.request(
            "POST", fakeURL + "/fake/codes", body: try JSONSerialization.data(withJSONObject: object))
        guard status == 200, let code = (try JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any])?["code"] as? String
        else { throw ServiceProcessError(message: "POST /fake/codes: \(status) \(body)") }
        return code
    }

    func inject(_ endpoint: String, _ responses: [Any], retryAfter: Int? = nil) async throws {
        var object: [String: Any] = ["endpoint": endpoint, "responses": responses]
        if let retryAfter { object["retry_after"] = retryAfter }
        let (status, body) = try await HTTP.request(
            "POST", fakeURL + "/fake/failures", body: try JSONSerialization.data(withJSONObject: object))
        guard status == 200 else { throw ServiceProcessError(message: "POST /fake/failures: \(status) \(body)") }
    }

    func calls() async throws -> [FakeAppleCall] {
        let (status, body) = try await HTTP.request("GET", fakeURL + "/fake/calls")
        guard status == 200 else { throw ServiceProcessError(message: "GET /fake/calls: \(status) \(body)") }
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .custom { decoder in
            let text = try decoder.singleValueContainer().decode(String.self)
            let formatter = ISO8601DateFormatter()
            formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
            guard let date = formatter.date(from: text) else {
                throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: text))
            }
            return date
        }
        return try decoder.decode([FakeAppleCall].self, from: Data(body.utf8))
    }
}
