import FakeApple
import Foundation
import HTTPServer
import JobQueue
import Logging
import Postgres
import AppleJobs

/// What every sequence of a model run shares: the harness (one database, the fake Apple, the real
/// Apple handlers), the real queue, a second set of handlers whose Apple calls time out quickly
/// (for the steps where Apple hangs), and a lock that keeps the notification worker and the
/// reconcile scheduler to one sequence at a time.
///
/// Sequences run side by side, each with a client ID and sub of its own, so Apple's answers
/// (injected per client ID), pauses and the fake's call log are per sequence. The notification
/// worker and the scheduler act on every account of the database; to keep each sequence's steps
/// its own, a sequence's notification jobs wait at `run_at = 'infinity'` and are made due only
/// under the lock, by the sequence whose step runs them.
final class ModelWorld: Sendable {
    let harness: LifecycleHarness
    let queue: JobQueue
    let handlers: [JobKind: any JobHandler]
    /// Handlers whose Apple is an endpoint that never answers in time: Apple hanging. The call never
    /// reaches the fake, so a client that gives up early (a loaded machine) cannot leave the fake
    /// having done work nobody heard of.
    let quickTimeoutHandlers: [JobKind: any JobHandler]
    private let hangingApple: HTTPServer
    let scheduler: ReconcileScheduler
    /// Short backoffs: the driver makes due whatever waits anyway (time passes between steps).
    let policy = RetryPolicy(base: .milliseconds(50), cap: .seconds(5))
    let exclusive = ModelLock()
    let logger: Logger
    /// Whether `siwa.request_deletion(client_id, sub, authorization_code)` exists.
    let deletionWithCode: Bool

    /// How long Apple's client waits on the steps where the fake hangs (`AppleAnswer.timeout`).
    static let quickTimeout: Duration = .milliseconds(400)

    init(lanes: Int) async throws {
        let logger = Logger(label: "lifecycle-model", level: .critical)
        self.logger = logger
        // Calls in flight are held by the fake, never timed out by the client: a generous bound.
        harness = try await LifecycleHarness(timeout: .seconds(60), hang: .seconds(3), logger: logger, poolSize: lanes * 2 + 2)
        queue = JobQueue(pool: harness.pool)
        handlers = try Self.byKind(makeAppleHandlers(settings: harness.settings, pool: harness.pool, logger: logger))
        hangingApple = HTTPServer(
            configuration: .init(host: "127.0.0.1", port: 0, threadCount: 1),
            handler: ClosureHTTPHandler { _, respond in
                DispatchQueue.global().asyncAfter(deadline: .now() + 3) { respond(.json(status: 504, #"{"error":"timeout"}"#)) }
            },
            logger: logger)
        try hangingApple.start()
        var quick = harness.settings
        quick.timeout = Self.quickTimeout
        quick.baseURL = URL(string: "http://127.0.0.1:\(hangingApple.port)")!
        quickTimeoutHandlers = try Self.byKind(makeAppleHandlers(settings: quick, pool: harness.pool, logger: logger))
        scheduler = ReconcileScheduler(pool: harness.pool, logger: logger)
        deletionWithCode =
            try await harness.scalar(
                Int.self,
                """
                SELECT count(*)::int FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                 WHERE n.nspname = 'siwa' AND p.proname = 'request_deletion' AND p.pronargs = 3
                """) ?? 0 > 0
    }

    private static func byKind(_ handlers: [any JobHandler]) -> [JobKind: any JobHandler] {
        Dictionary(handlers.map { ($0.kind, $0) }, uniquingKeysWith: { first, _ in first })
    }

    func shutDown() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            DispatchQueue.global().async {
                self.hangingApple.stop()
                continuation.resume()
            }
        }
        await harness.shutDown()
    }

    var fake: FakeApple { harness.fake }

    /// A connection for one lane's app transactions and driver queries. No wait is unbounded.
    func connect() async throws -> PostgresConnection {
        let connection = try await harness.database.connect()
        try await connection.simpleQuery("SET lock_timeout = '10s'; SET statement_timeout = '30s'")
        return connection
    }

    // MARK: Running a claimed job the way the worker's executor does

    /// The fake endpoints a job of `kind` calls first.
    static func endpoints(of kind: JobKind) -> [String] {
        switch kind {
        case .exchange, .reconcile: ["token"]
        case .revoke: ["revoke", "token"]
        case .notification, .webhook: []
        }
    }

    /// Queues Apple's answer for the next call of `clientID` (nothing for `.ok`, nor for `.timeout`:
    /// those calls go to the hanging endpoint).
    func inject(_ answer: AppleAnswer, clientID: String, endpoints: [String]) {
        guard answer != .timeout, let failure = Self.failure(for: answer) else { return }
        for endpoint in endpoints { fake.injectFailures(endpoint: endpoint, clientID: clientID, responses: [failure]) }
    }

    static func failure(for answer: AppleAnswer) -> FakeAppleFailure? {
        switch answer {
        case .ok: nil
        case .invalidGrant: .oauthError("invalid_grant")
        case .unavailable: .status(503)
        case .timeout: .timeout
        case .invalidClient: .oauthError("invalid_client")
        }
    }

    /// Runs the handler of a claimed job and records its result as the executor does
    /// (`JobLifecycle.decide`, then the fenced `JobQueue.apply`). Returns what happened, for the trace.
    func execute(_ job: Job, answer: AppleAnswer, clientID: String) async throws -> String {
        let handlers = answer == .timeout ? quickTimeoutHandlers : handlers
        guard let handler = handlers[job.kind] else { return "no handler for \(job.kind.rawValue)" }
        inject(answer, clientID: clientID, endpoints: Self.endpoints(of: job.kind))
        let result = await handler.run(job, logger: logger)
        fake.clearFailures(clientID: clientID)
        let recorded = try await queue.apply(JobLifecycle.decide(result), to: job, policy: policy)
        return "\(job.kind.rawValue) job \(job.id) attempt \(job.attempt): \(Self.describe(result))"
            + (recorded != nil ? "" : " (lease lost: result dropped)")
    }

    static func describe(_ result: JobResult) -> String {
        switch result {
        case .completed(let outcome): "completed \(outcome)"
        case .completedByHandler: "completed by handler"
        case .failed(let error, _): "failed \(error)"
        case .snoozed(let reason, _): "snoozed \(reason)"
        case .discarded(let error): "discarded \(error)"
        }
    }
}

/// An async mutual exclusion (FIFO), for steps that act on the whole database.
actor ModelLock {
    private var held = false
    private var waiting: [CheckedContinuation<Void, Never>] = []

    func withLock<T: Sendable>(_ body: @Sendable () async throws -> T) async rethrows -> T {
        await acquire()
        defer { release() }
        return try await body()
    }

    private func acquire() async {
        guard held else {
            held = true
            return
        }
        await withCheckedContinuation { waiting.append($0) }
    }

    private func release() {
        if waiting.isEmpty { held = false } else { waiting.removeFirst().resume() }
    }
}
