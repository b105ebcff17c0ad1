import CryptoCore
import FakeApple
import Foundation
import Logging
import Postgres
import TestTiming

#if canImport(Glibc)
    import Glibc
#endif

/// A fake Apple on 127.0.0.1 checking our client_secret against a fresh `.p8`, and the environment
/// that makes a real `siwa-worker` process call it (exchange, revoke).
final class FakeAppleForWorkers: Sendable {
    static let clientID = "com.example.app"
    static let teamID = "TEAM123456"

    let fake: FakeApple
    let keyDirectory: URL
    let environment: [String: String]

    /// `hang`: how long an injected `timeout` holds the request (past the worker's 10 s Apple timeout).
    init(hang: Duration = .seconds(12)) throws {
        let p8 = try TestSecrets.SigningKey()
        keyDirectory = p8.directory
        fake = try FakeApple(
            configuration: .init(verifyKey: p8.privateKey.publicKey, teamID: Self.teamID, hangDuration: hang),
            logger: Logger(label: "fake-apple", level: .warning))
        try fake.start()
        environment = [
            "SIWA_APPLE_CALLS": "enabled", "SIWA_APPLE_BASE_URL": fake.baseURL.absoluteString,
            "SIWA_TEAM_ID": Self.teamID, "SIWA_KEY_ID": "TESTKEY", "SIWA_PRIVATE_KEY_FILE": p8.path,
            "SIWA_TOKEN_KEYS": TestSecrets.tokenKeys(),
        ]
    }

    /// A fake stopped by `teardown` when the test ends.
    convenience init(hang: Duration = .seconds(12), stoppedBy teardown: Teardown) throws {
        try self.init(hang: hang)
        teardown.add { await self.shutDown() }
    }

    /// Stops the fake off the cooperative pool (stop blocks for its grace period).
    func shutDown() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            DispatchQueue.global().async {
                self.fake.stop()
                continuation.resume()
            }
        }
        try? FileManager.default.removeItem(at: keyDirectory)
    }

    /// Links `subs` the way an app does (`siwa.link_account` with a code from the fake) and waits
    /// until a running worker has exchanged every code.
    func link(_ subs: [String], prefix: String, on connection: PostgresConnection) async throws {
        for sub in subs {
            let code = fake.registerCode(clientID: Self.clientID, sub: sub, email: "\(sub)@privaterelay.appleid.com", isPrivateEmail: true)
            _ = try await connection.query("SELECT siwa.link_account(\(Self.clientID), \(sub), \("user-" + sub), \(code))")
        }
        try await connection.waitFor(
            "SELECT count(*) FROM siwa.accounts WHERE status = 'active' AND sub LIKE \(prefix + "%")", timeout: .seconds(30)
        ) { $0 == subs.count }
    }

    /// Whether Apple saw a revoke for every refresh token issued to `sub`.
    func everyTokenRevoked(_ sub: String) -> Bool {
        let tokens = fake.refreshTokens(clientID: Self.clientID, sub: sub)
        return !tokens.isEmpty && tokens.allSatisfy { fake.isRevoked(refreshToken: $0) == true }
    }
}

/// Resident set size of a process in kB (`VmRSS` in /proc/PID/status), nil when unreadable.
func residentKilobytes(_ pid: Int32) -> Int? {
    guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return nil }
    for line in status.split(separator: "\n") where line.hasPrefix("VmRSS:") {
        return Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "")
    }
    return nil
}

/// Many POSTs at once (the client opens as many connections as there are calls in flight).
enum WideHTTP {
    static func post(_ url: String, body: Data) async throws -> (status: Int, body: String) {
        try await HTTP.request("POST", url, body: body, timeout: TestTimeScale.scaled(.seconds(30)))
    }
}

/// Runs `body` for each element with at most `width` in flight; results in input order.
func concurrentMap<T: Sendable, R: Sendable>(
    _ items: [T], width: Int, _ body: @escaping @Sendable (T) async throws -> R
) async throws -> [R] {
    try await withThrowingTaskGroup(of: (Int, R).self) { group in
        var results = [R?](repeating: nil, count: items.count)
        var next = 0
        func add() {
            guard next < items.count else { return }
            let index = next
            let item = items[index]
            group.addTask { (index, try await body(item)) }
            next += 1
        }
        for _ in 0..<min(width, items.count) { add() }
        while let (index, result) = try await group.next() {
            results[index] = result
            add()
        }
        return results.map { $0! }
    }
}

/// The scaffold of a test that runs real workers against a fake Apple: the fake, a migrated
/// database and a connection to it. What `body` adds to `teardown` (its workers) stops first, then
/// the database goes, then the fake.
func withWorkersAgainstFakeApple<T>(
    hang: Duration = .seconds(12),
    _ body: (FakeAppleForWorkers, MigratedDatabase, PostgresConnection, Teardown) async throws -> T
) async throws -> T {
    try await withTeardown { outer in
        let apple = try FakeAppleForWorkers(hang: hang, stoppedBy: outer)
        return try await withMigratedDatabase { database in
            try await withTeardown { teardown in
                let connection = try await database.connect()
                defer { connection.close() }
                return try await body(apple, database, connection, teardown)
            }
        }
    }
}
