import AppleClient
import ChildProcesses
import CryptoCore
import FakeApple
import Foundation
import Logging
import Postgres
import AppAPI
import AppleJobs
import Settings
import Metrics
import TestTiming
import StoredTokens

/// Two developer teams at one fake Apple (each with its own `.p8`, both checked), and the
/// `siwa accounts transfer` commands run as either team: a real `siwa` child process whose stdin,
/// stdout and stderr are files, so a test can stop it midway.
final class TransferHarness: Sendable {
    static let clientID = "com.example.app"
    static let teamA = "TEAMAAAA01"
    static let teamB = "TEAMBBBB02"
    static let keyID = "TRANSFER01"

    let fake: FakeApple
    let directory: URL

    init() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("siwa-transfer-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let keyA = try TestSecrets.SigningKey(fileName: "\(Self.teamA).p8", in: directory).privateKey
        let keyB = try TestSecrets.SigningKey(fileName: "\(Self.teamB).p8", in: directory).privateKey
        fake = try FakeApple(
            configuration: .init(
                verifyKey: keyA.publicKey, teamID: Self.teamA, hangDuration: .milliseconds(200),
                otherTeams: [.init(id: Self.teamB, verifyKey: keyB.publicKey)]),
            logger: Logger(label: "fake-apple", level: .warning))
        try fake.start()
    }

    func stop() {
        fake.stop()
        try? FileManager.default.removeItem(at: directory)
    }

    /// The variables a team's operator sets for the command.
    func environment(team: String, database: MigratedDatabase) -> [String: String] {
        environment(team: team, databaseURL: database.url)
    }

    func environment(team: String, databaseURL: String) -> [String: String] {
        [
            "DATABASE_URL": databaseURL, "SIWA_APPLE_BASE_URL": fake.baseURL.absoluteString, "SIWA_TEAM_ID": team,
            "SIWA_KEY_ID": Self.keyID, "SIWA_PRIVATE_KEY_FILE": directory.appendingPathComponent("\(team).p8").path,
            "SIWA_CLIENT_IDS": Self.clientID, "SIWA_RETRY_BASE": "10ms", "SIWA_LOG_LEVEL": "warn",
        ]
    }

    /// Starts `siwa accounts transfer ...` as `team`.
    func start(_ arguments: [String], team: String, database: MigratedDatabase, stdin: String? = nil) throws -> CommandRun {
        try CommandRun(["accounts", "transfer"] + arguments, environment: environment(team: team, database: database), stdin: stdin, in: directory)
    }

    /// Runs it to the end (bounded).
    func run(_ arguments: [String], team: String, database: MigratedDatabase, stdin: String? = nil) async throws -> CommandRun {
        let run = try start(arguments, team: team, database: database, stdin: stdin)
        guard await run.waitForExit(timeout: .seconds(120)) != nil else {
            run.kill()
            throw ServiceProcessError(message: "siwa \(arguments.joined(separator: " ")) did not finish:\n\(run.stderr)")
        }
        return run
    }

    /// A fresh sending database holding `count` accounts from `seedAccounts`, with a connection to it.
    static func withSender(accounts count: Int, _ body: (MigratedDatabase, PostgresConnection) async throws -> Void) async throws {
        try await withMigratedDatabase { sender in
            let connection = try await sender.connect()
            defer { connection.close() }
            try await seedAccounts(count, on: connection)
            try await body(sender, connection)
        }
    }

    /// `count` active accounts `sub-NNNN` / `user-NNNN` linked under team A, with a stored (sealed) token.
    static func seedAccounts(_ count: Int, on connection: PostgresConnection, prefix: String = "") async throws {
        _ = try await connection.execute(
            """
            INSERT INTO siwa.accounts (client_id, sub, app_user_id, status, email, is_private_email, refresh_token_enc, linked_at)
            SELECT \(clientID)::text, \(prefix)::text || 'sub-' || lpad(n::text, 4, '0'), \(prefix)::text || 'user-' || lpad(n::text, 4, '0'),
                   'active', 'a' || n || '@privaterelay.appleid.com', true, '\\x0102'::bytea, now()
              FROM generate_series(1, \(count)) AS n
            """)
    }
}

/// One `siwa` child process (a `ChildProcess`) with files for stdout and stderr, and stdin fed
/// whole and then closed (a command reading a file from `-` sees all of it, then its end).
final class CommandRun: Sendable {
    private let child: ChildProcess
    private let outPath: URL
    private let errPath: URL

    init(_ arguments: [String], environment: [String: String], stdin: String?, in directory: URL) throws {
        let id = UUID().uuidString
        outPath = directory.appendingPathComponent("out-\(id)")
        errPath = directory.appendingPathComponent("err-\(id)")
        child = try ChildProcess(
            try ServiceProcess.executable("siwa").path, arguments,
            options: .init(
                environment: ServiceProcess.childEnvironment(environment), input: stdin.map { .text($0) } ?? .none,
                output: .file(outPath.path), error: .file(errPath.path)))
    }

    var stdout: String { (try? String(contentsOf: outPath, encoding: .utf8)) ?? "" }
    var stderr: String { (try? String(contentsOf: errPath, encoding: .utf8)) ?? "" }
    var isRunning: Bool { child.isRunning }
    /// The exit code (128 + signal when killed); -1 while running.
    var status: Int32 { child.exitCode ?? -1 }

    /// Waits for exit (bounded, scaled); the status, or nil when it is still running at the deadline.
    func waitForExit(timeout: Duration) async -> Int32? {
        await child.waitForExit(timeout: TestTimeScale.scaled(timeout))?.code
    }

    /// SIGKILL: the harshest interruption (no chance to finish anything), then the reap.
    func kill() {
        child.signal(SIGKILL)
        _ = child.waitForExitBlocking(timeout: .seconds(10))
    }
}

/// The app API (`POST /v1/sign-in`) served in process as the recipient team would run it: over
/// `database`, with team B's credentials and the fake's keys.
final class TransferSignIn: Sendable {
    static let token = "transfer-test-api-token-0123456789abcdef"
    let harness: TransferHarness
    let pool: PostgresPool
    let server: AppAPIServer
    let serving: Task<Void, any Error>

    init(harness: TransferHarness, database: MigratedDatabase) async throws {
        self.harness = harness
        let logger = Logger(label: "transfer-sign-in", level: .warning)
        let key = try P256.Signing.PrivateKey(
            pemRepresentation: String(
                contentsOf: harness.directory.appendingPathComponent("\(TransferHarness.teamB).p8"), encoding: .utf8))
        let apple = AppleHTTP(baseURL: harness.fake.baseURL)
        pool = PostgresPool(conninfo: database.url, size: 2, acquireTimeout: .seconds(60), logger: logger)
        let context = AppleJobContext(
            pool: pool,
            client: AppleAuthClient(
                http: apple, signer: ClientSecretSigner(teamID: TransferHarness.teamB, keyID: TransferHarness.keyID, privateKey: key)),
            tokenBox: try TokenBox(configuration: TestSecrets.tokenKeys(["t1"])),
            identityVerifier: IdentityTokenVerifier(keys: AppleKeySet(http: apple, logger: logger)))
        server = AppAPIServer(
            configuration: AppAPIConfiguration(listen: ListenAddress(host: "127.0.0.1", port: 0), tokens: [Self.token]),
            clientIDs: [TransferHarness.clientID], apple: context, pool: pool, registry: MetricsRegistry(), logger: logger,
            appleTimeout: .seconds(20), databaseTimeout: .seconds(60))
        let server = server
        serving = try await server.runInBackground()
    }

    func stop() async {
        serving.cancel()
        _ = try? await serving.value
        pool.close()
    }

    /// A returning user of team A signs in under team B: Apple's token carries the new `sub` and,
    /// for 60 days, `transfer_sub`. Answers the sign-in's status and JSON body.
    func signIn(originalSub: String, transferSub: String) async throws -> (status: Int, body: [String: Any]) {
        let identity = FakeApple.migratedIdentity(of: originalSub, fromTeam: TransferHarness.teamA, toTeam: TransferHarness.teamB)
        let nonce = try await post("/v1/nonces", [:]).body["nonce"] as? String ?? ""
        let identityToken = harness.fake.signIDToken(
            clientID: TransferHarness.clientID, sub: identity.sub, email: identity.email, isPrivateEmail: identity.isPrivateEmail,
            transferSub: transferSub, nonce: IdentityTokenVerifier.nonceClaim(rawNonce: nonce))
        return try await post(
            "/v1/sign-in", ["client_id": TransferHarness.clientID, "identity_token": identityToken, "nonce": nonce])
    }

    private func post(_ path: String, _ body: [String: Any]) async throws -> (status: Int, body: [String: Any]) {
        let (status, text) = try await HTTP.request(
            "POST", "http://127.0.0.1:\(server.port)\(path)", body: try JSONSerialization.data(withJSONObject: body), bearer: Self.token)
        let object = (try? JSONSerialization.jsonObject(with: Data(text.utf8))) as? [String: Any] ?? [:]
        return (status, object)
    }
}
