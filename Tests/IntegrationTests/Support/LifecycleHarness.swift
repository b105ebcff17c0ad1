import AppleClient
import CryptoCore
import FakeApple
import Foundation
import JobQueue
import Logging
import Postgres
import AppleJobs
import TestTiming
import StoredTokens

/// A migrated database, a fake Apple on 127.0.0.1:0 checking our client_secret against a fresh
/// `.p8`, and the Apple handlers wired to both. Jobs are claimed with a plain UPDATE, as the
/// executor would, and handed to the handlers directly.
final class LifecycleHarness: Sendable {
    static let clientID = "com.example.app"
    static let teamID = "TEAM123456"

    let database: MigratedDatabase
    let fake: FakeApple
    let connection: PostgresConnection
    let pool: PostgresPool
    let context: AppleJobContext
    let exchange: ExchangeJobHandler
    let revoke: RevokeJobHandler
    let reconcile: ReconcileJobHandler
    let logger: Logger
    let tokenKeys: String
    let keyDirectory: URL
    /// What the handlers were built from (a test may build more handlers, e.g. with another timeout).
    let settings: AppleSettings

    /// `timeout` bounds each Apple call (times `TestTimeScale`); `hang` is how long an injected
    /// `.timeout` holds its answer, far longer than `timeout` (30 s against 5 s, both times
    /// `TestTimeScale` by default), so only a working client-side bound can end the call in time.
    init(
        timeout: Duration = .seconds(5), hang: Duration = TestTimeScale.scaled(.seconds(30)), tokenKeys: String? = nil,
        logger: Logger? = nil, poolSize: Int = 2
    ) async throws {
        let logger = logger ?? Logger(label: "lifecycle-test", level: .warning)
        self.logger = logger
        database = try await Self.makeDatabase()
        let p8 = try TestSecrets.SigningKey()
        keyDirectory = p8.directory
        fake = try FakeApple(
            configuration: .init(verifyKey: p8.privateKey.publicKey, teamID: Self.teamID, hangDuration: hang), logger: logger)
        try fake.start()
        self.tokenKeys = tokenKeys ?? TestSecrets.tokenKeys(["k1"])
        let settings = AppleSettings(
            teamID: Self.teamID, keyID: "TESTKEY", privateKeyPEMPath: p8.path, tokenKeys: self.tokenKeys,
            baseURL: fake.baseURL, timeout: TestTimeScale.scaled(timeout))
        try settings.validate()
        self.settings = settings
        connection = try await database.connect()
        pool = PostgresPool(conninfo: database.url, size: poolSize, acquireTimeout: TestTimeScale.scaled(.seconds(5)), logger: logger)
        context = try makeAppleJobContext(settings: settings, pool: pool, logger: logger)
        exchange = ExchangeJobHandler(context: context)
        revoke = RevokeJobHandler(context: context)
        reconcile = ReconcileJobHandler(context: context)
        let handlers = try makeAppleHandlers(settings: settings, pool: pool, logger: logger)
        precondition(Set(handlers.map(\.kind)) == [.exchange, .revoke, .reconcile])
    }

    /// Migrations create cluster-wide roles, so two databases migrated at the same moment can
    /// collide (23505 on pg_authid); such a collision is retried.
    static func makeDatabase() async throws -> MigratedDatabase {
        var attempt = 0
        while true {
            do { return try await MigratedDatabase.make() } catch let error as PostgresError where attempt < 5 && error.sqlState == "23505" {
                attempt += 1
                try await Task.sleep(for: .milliseconds(Int.random(in: 50...300)))
            }
        }
    }

    func shutDown() async {
        connection.close()
        pool.close()
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            DispatchQueue.global().async {
                self.fake.stop()
                continuation.resume()
            }
        }
        try? FileManager.default.removeItem(at: keyDirectory)
        await database.drop()
    }


    var tokenBox: TokenBox { context.tokenBox }

    // MARK: Queue

    /// Claims job `id` the way the executor does: running, attempt + 1, leased.
    func claim(_ id: Int64, on connection: PostgresConnection? = nil) async throws -> Job {
        // The same columns and decoding as the worker's claim.
        let rows = try await (connection ?? self.connection).query(
            """
            UPDATE siwa.jobs j SET state = 'running', attempt = attempt + 1, locked_by = 'test',
                   locked_until = now() + interval '5 minutes'
             WHERE id = \(id) AND state = 'available'
            RETURNING \(unsafeSQL: JobQueue.jobColumns)
            """)
        guard let row = rows.first else { throw HarnessError(message: "job \(id) not available") }
        return try JobQueue.job(from: row)
    }

    /// Claims and runs job `id`, then applies the result as a minimal executor would.
    @discardableResult
    func run(_ id: Int64) async throws -> JobResult {
        let job = try await claim(id)
        let handler: any JobHandler =
            switch job.kind {
            case .exchange: exchange
            case .revoke: revoke
            case .reconcile: reconcile
            case .notification, .webhook: fatalError("not an Apple job")
            }
        let result = await handler.run(job, logger: logger)
        switch result {
        case .completedByHandler:
            break
        case .completed(let outcome):
            _ = try await connection.execute(
                "UPDATE siwa.jobs SET state = 'completed', outcome = \(outcome), finalized_at = now() WHERE id = \(id)")
        case .failed(let error, _):
            _ = try await connection.execute(
                """
                UPDATE siwa.jobs SET state = CASE WHEN attempt >= max_attempts THEN 'discarded' ELSE 'available' END,
                       errors = errors || jsonb_build_array(\(error)::text), locked_by = NULL, locked_until = NULL
                 WHERE id = \(id)
                """)
        case .snoozed:
            _ = try await connection.execute(
                "UPDATE siwa.jobs SET state = 'available', attempt = attempt - 1, locked_by = NULL WHERE id = \(id)")
        case .discarded(let error):
            _ = try await connection.execute(
                "UPDATE siwa.jobs SET state = 'discarded', errors = errors || jsonb_build_array(\(error)::text) WHERE id = \(id)")
        }
        return result
    }

    // MARK: App-facing SQL

    func link(sub: String, appUserID: String = "user-1", code: String) async throws -> Int64 {
        try await connection.query(
            "SELECT siwa.link_account(\(Self.clientID), \(sub), \(appUserID), \(code))")[0].decode(Int64.self, at: 0)
    }

    /// Links `sub` through the fake: registers a code, queues and runs the exchange.
    func linkAccount(sub: String, email: String? = "u@privaterelay.appleid.com") async throws {
        let code = fake.registerCode(clientID: Self.clientID, sub: sub, email: email, isPrivateEmail: true)
        let result = try await run(try await link(sub: sub, code: code))
        guard result == .completedByHandler, try await status(sub) == "active" else {
            throw HarnessError(message: "link of \(sub) failed: \(result)")
        }
    }

    func requestDeletion(sub: String) async throws -> Int64 {
        try await connection.query("SELECT siwa.request_deletion(\(Self.clientID), \(sub))")[0].decode(Int64.self, at: 0)
    }

    func status(_ sub: String) async throws -> String? {
        try await connection.query(
            "SELECT status FROM siwa.accounts WHERE client_id = \(Self.clientID) AND sub = \(sub)"
        ).first?.decode(String.self, column: "status")
    }

    func storedToken(_ sub: String) async throws -> [UInt8]? {
        try await connection.query(
            "SELECT refresh_token_enc FROM siwa.accounts WHERE client_id = \(Self.clientID) AND sub = \(sub)"
        ).first?.decode([UInt8]?.self, column: "refresh_token_enc")
    }

    /// How many tokens the account holds: the current one and those kept for a deletion to revoke.
    func heldTokenCount(_ sub: String) async throws -> Int {
        try await scalar(
            Int.self,
            """
            SELECT (refresh_token_enc IS NOT NULL)::int + cardinality(retired_tokens_enc)
              FROM siwa.accounts WHERE client_id = \(Self.clientID) AND sub = \(sub)
            """) ?? 0
    }

    func changes(_ sub: String) async throws -> [(change: String, reason: String?)] {
        try await connection.query(
            "SELECT change, reason FROM siwa.account_changes WHERE client_id = \(Self.clientID) AND sub = \(sub) ORDER BY id"
        ).map { (try $0.decode(String.self, column: "change"), try $0.decode(String?.self, column: "reason")) }
    }

    func jobRow(_ id: Int64) async throws -> (state: String, outcome: String?, args: String) {
        let row = try await connection.query("SELECT state, outcome, args::text AS args FROM siwa.jobs WHERE id = \(id)")[0]
        return (try row.decode(String.self, column: "state"), try row.decode(String?.self, column: "outcome"),
                try row.decode(String.self, column: "args"))
    }

    func scalar<T: PostgresDecodable>(_ type: T.Type, _ query: PostgresQuery) async throws -> T? {
        try await connection.query(query).first?.decode(T?.self, at: 0)
    }
}

struct HarnessError: Error, CustomStringConvertible {
    var message: String
    var description: String { message }
}

/// Runs `body` with a fresh harness and shuts it down afterwards.
func withLifecycle<T>(
    timeout: Duration = .seconds(5), logger: Logger? = nil, _ body: (LifecycleHarness) async throws -> T
) async throws -> T {
    let harness = try await LifecycleHarness(timeout: timeout, logger: logger)
    do {
        let value = try await body(harness)
        await harness.shutDown()
        return value
    } catch {
        await harness.shutDown()
        throw error
    }
}
