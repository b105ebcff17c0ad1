import AppleClient
import FakeApple
import Foundation
import JobQueue
import Postgres
import WorkerCore

/// One generated sequence, driven against the real SQL and handlers for one account of its own
/// (a fresh client ID and sub), then to quiescence; `LifecycleModelRun+Checks` judges the result.
final class ModelRun {
    let world: ModelWorld
    let connection: PostgresConnection
    /// The account's client ID: where the app links and deletes (a Services ID when grouped).
    let clientID: String
    /// The `aud` of Apple's notifications: the group's primary App ID when grouped, else `clientID`.
    let notificationClientID: String
    let sub: String
    /// What each step did, for the failure report.
    var trace: [String] = []
    /// How often each kind of step did something (was not a no-op), and notable results: the
    /// run prints the totals, to show what the sequences exercised.
    var exercised: [String: Int] = [:]
    var violations: [ModelViolation] = []

    /// App calls that committed, in commit order.
    private(set) var committed: [CommittedCall] = []
    /// Every refresh token seen stored on the account (decrypted), after any step or job.
    private(set) var everStored: Set<String> = []
    private var storedNow: Set<String> = []
    /// Tokens that were stored and later replaced or discarded, with what dropped them.
    private(set) var dropped: [String: String] = [:]
    private var newestEvent: Date?
    /// When each step started: what `notify(_:stepsBack:)` anchors its `event_time` to.
    private var stepStarts: [Date] = []
    private var notificationCount = 0
    private var linkCount = 0
    private var inFlight: InFlight?
    private var stalled: Job?

    struct CommittedCall {
        var call: AppCall
        /// The code registered at the fake for this call, if it took one.
        var code: String?
        /// The account's status just before the call, inside its transaction.
        var statusBefore: String?
        /// The newest `account_changes` id of the account right after the commit.
        var changeMark: Int64
        /// The job the call returned.
        var jobID: Int64
    }

    private struct InFlight {
        var task: Task<String, any Error>
        var holds: [FakeAppleHeldCall]
        var answer: AppleAnswer
        var finished: LockedBox<Bool>
    }

    /// `grouped`: the account is linked under a website's Services ID grouped (`SIWA_APP_GROUPS`)
    /// with the app's primary App ID, to which Apple sends the notifications.
    init(world: ModelWorld, connection: PostgresConnection, name: String, grouped: Bool) {
        self.world = world
        self.connection = connection
        notificationClientID = "com.model.\(name)"
        clientID = grouped ? notificationClientID + ".web" : notificationClientID
        sub = "000.\(name)"
    }

    /// Runs every step, then drives the account to quiescence.
    func run(_ steps: [ModelStep]) async {
        if clientID != notificationClientID {
            do {
                // What the worker stores from SIWA_APP_GROUPS (AppGroups.store replaces the whole
                // table; each sequence adds only its own group).
                _ = try await connection.execute(
                    """
                    INSERT INTO siwa.app_groups (client_id, group_id)
                    VALUES (\(notificationClientID), \(notificationClientID)), (\(clientID), \(notificationClientID))
                    """)
                trace.append("0. \(clientID) grouped with \(notificationClientID), where Apple's notifications go")
            } catch {
                violations.append(.init(.harness, "app group setup threw \(Self.errorKind(error))", "\(error)"))
            }
        }
        for (index, step) in steps.enumerated() {
            stepStarts.append(Date())
            do {
                let what = try await perform(step, index: index)
                trace.append("\(index + 1). \(step) → \(what)")
                count(step, result: what)
                try await observeStoredToken(after: Self.doer(of: what) ?? step.category)
            } catch {
                trace.append("\(index + 1). \(step) → error \(error)")
                violations.append(.init(.harness, "step threw \(Self.errorKind(error))", "step \(index + 1) (\(step)): \(error)"))
            }
        }
        do {
            try await quiesce()
        } catch {
            violations.append(.init(.harness, "quiescence threw \(Self.errorKind(error))", "\(error)"))
        }
    }

    private static let noOps = [
        "no Apple job", "nothing in flight", "nothing pending", "no stalled worker", "scheduler queued 0",
        "a call is already in flight", "a worker is already stalled",
    ]

    private func count(_ step: ModelStep, result: String) {
        guard !Self.noOps.contains(where: result.hasPrefix) else { return }
        exercised[step.category, default: 0] += 1
        let notable = [
            "lease lost": "result fenced out (lease lost)", "failed timeout": "Apple call timed out at the client",
            "snoozed client_paused": "client ID paused", "raised 55000": "link refused (55000)",
            "waiting for Apple": "Apple call held while other steps ran",
        ]
        for (needle, name) in notable where result.contains(needle) { exercised[name, default: 0] += 1 }
    }

    static func errorKind(_ error: any Error) -> String {
        if let error = error as? PostgresError { return "\(error.code) \(error.sqlState ?? "")" }
        return String(describing: type(of: error))
    }

    // MARK: Steps

    private func perform(_ step: ModelStep, index: Int) async throws -> String {
        switch step {
        case .app(let calls): return try await app(calls)
        case .notify(let kind, let back): return try await notify(kind, stepsBack: back, index: index)
        case .applyNotifications(let oldest): return try await applyNotifications(onlyOldest: oldest)
        case .work(let pick, let answer):
            guard let job = try await claim(pick: pick) else { return "no Apple job" }
            return try await world.execute(job, answer: answer, clientID: clientID)
        case .slowWork(let pick, let answer): return try await startSlowWork(pick: pick, answer: answer)
        case .release: return try await releaseInFlight(answering: nil)
        case .crash(let pick):
            guard let job = try await claim(pick: pick) else { return "no Apple job" }
            try await expireLease(of: job)
            return "\(job.kind.rawValue) job \(job.id) attempt \(job.attempt) abandoned and rescued"
        case .stall(let pick):
            guard stalled == nil else { return "a worker is already stalled" }
            guard let job = try await claim(pick: pick) else { return "no Apple job" }
            try await expireLease(of: job)
            stalled = job
            return "\(job.kind.rawValue) job \(job.id) attempt \(job.attempt) stalled, lease expired, rescued"
        case .resumeStalled(let answer): return try await resumeStalled(answer: answer)
        case .reconcile: return try await reconcile()
        case .userRevokesAtApple:
            world.fake.userEndedGrants(clientID: clientID, sub: sub, issuedBefore: stepStarts[index])
            return "grants ended at Apple"
        }
    }

    private func app(_ calls: [AppCall]) async throws -> String {
        var attempted: [CommittedCall] = []
        var outcome: [String] = []
        do {
            try await connection.withTransaction { connection in
                for call in calls {
                    let before = try await self.status(on: connection)
                    var code: String?
                    if call.takesCode(deletionWithCode: world.deletionWithCode) {
                        code = world.fake.registerCode(
                            clientID: clientID, sub: sub, email: "\(sub)@privaterelay.appleid.com", isPrivateEmail: true)
                    }
                    let job: Int64
                    do {
                        job = try await self.call(call, code: code, on: connection)
                        outcome.append("\(call) = job \(job) (status was \(before ?? "none"))")
                        if call.isLink, before == "pending_deletion" {
                            violations.append(
                                .init(
                                    .linkBlockedWhilePending, "link_account accepted on pending_deletion",
                                    "link_account returned job \(job) instead of raising 55000"))
                        }
                    } catch let error as PostgresError {
                        let expected =
                            call.isLink && before == "pending_deletion" && error.sqlState == "55000"
                            && error.message.contains("deletion pending")
                        outcome.append("\(call) raised \(error.sqlState ?? "?") (status was \(before ?? "none")); rolled back")
                        if !expected {
                            violations.append(
                                .init(
                                    call.isLink ? .linkBlockedWhilePending : .appCall,
                                    "\(call) raised \(error.sqlState ?? "?") on \(before ?? "no account")", "\(error)"))
                        }
                        throw error
                    }
                    attempted.append(CommittedCall(call: call, code: code, statusBefore: before, changeMark: 0, jobID: job))
                }
            }
        } catch is PostgresError {
            return outcome.joined(separator: "; ")
        }
        let mark = try await latestChangeID()
        for var call in attempted {
            call.changeMark = mark
            committed.append(call)
        }
        return outcome.joined(separator: "; ")
    }

    private func call(_ call: AppCall, code: String?, on connection: PostgresConnection) async throws -> Int64 {
        switch call {
        case .link(let long):
            linkCount += 1
            let appUserID = long ? String(repeating: "u", count: 8000) : "user-\(linkCount)"
            return try await connection.query(
                "SELECT siwa.link_account(\(clientID), \(sub), \(appUserID), \(code))")[0].decode(Int64.self, at: 0)
        case .requestDeletion:
            if let code {
                return try await connection.query("SELECT siwa.request_deletion(\(clientID), \(sub), \(code))")[0]
                    .decode(Int64.self, at: 0)
            }
            return try await connection.query("SELECT siwa.request_deletion(\(clientID), \(sub))")[0].decode(Int64.self, at: 0)
        }
    }

    private func notify(_ kind: NotificationKind, stepsBack back: Int?, index: Int) async throws -> String {
        notificationCount += 1
        let time: Date
        if let back {
            // Just before that step began: after everything earlier steps did (tokens issued,
            // links committed: each step ends with a database round trip), before anything it did.
            let anchor = index - back
            let start = anchor >= 0 ? stepStarts[anchor] : stepStarts[0].addingTimeInterval(Double(anchor))
            time = start.addingTimeInterval(-Double(1 + notificationCount % 25) * 1e-6)
        } else {
            time = max(stepStarts[index], (newestEvent ?? .distantPast).addingTimeInterval(1e-6))
        }
        newestEvent = max(newestEvent ?? time, time)
        let prefix = "\(clientID).n\(notificationCount)."
        let jti = prefix + "1"
        try await connection.withTransaction { connection in
            try await world.harness.database.queueNotifications(
                1, prefix: prefix, clientID: notificationClientID, sub: sub, types: [kind.rawValue],
                eventTime: "to_timestamp(\(time.timeIntervalSince1970))", on: connection)
            // Parked until one of this sequence's steps runs the notification worker.
            _ = try await connection.execute("UPDATE siwa.jobs SET run_at = 'infinity' WHERE notification_jti = \(jti)")
        }
        if kind.endsGrants { world.fake.userEndedGrants(clientID: clientID, sub: sub, issuedBefore: time) }
        return "stored \(jti)"
    }

    /// Makes the sequence's parked notification jobs due (all or the oldest), runs the real
    /// notification batch (which then claims only them), and parks what is left.
    private func applyNotifications(onlyOldest: Bool) async throws -> String {
        let (clientID, audience, world, connection) = (clientID, notificationClientID, world, connection)
        let results = try await world.exclusive.withLock {
            _ = try await connection.execute(
                """
                UPDATE siwa.jobs SET run_at = now()
                 WHERE client_id = \(audience) AND kind = 'notification' AND state = 'available'
                   AND (NOT \(onlyOldest) OR id = (SELECT min(id) FROM siwa.jobs WHERE client_id = \(audience)
                                                       AND kind = 'notification' AND state = 'available'))
                """)
            let results = try await world.queue.runNotificationBatch(
                worker: "model", limit: 64, lease: .seconds(60), policy: world.policy)
            _ = try await connection.execute(
                """
                UPDATE siwa.jobs SET run_at = 'infinity'
                 WHERE client_id = \(audience) AND kind = 'notification' AND state = 'available'
                """)
            return results
        }
        for result in results where result.state != "completed" {
            violations.append(
                .init(
                    .notificationOnce, "notification job \(result.state)",
                    "job \(result.jobID) (\(result.jti ?? "?")): \(result.error ?? "")"))
        }
        if results.contains(where: { !($0.jti ?? "").hasPrefix(clientID + ".") }) {
            violations.append(.init(.harness, "notification batch took another sequence's job", "\(results)"))
        }
        return results.isEmpty ? "nothing pending" : results.map { "\($0.jti ?? "?") \($0.outcome ?? $0.state)" }.joined(separator: ", ")
    }

    private func reconcile() async throws -> String {
        let (clientID, sub, connection, scheduler) = (clientID, sub, connection, world.scheduler)
        let queued = try await world.exclusive.withLock {
            _ = try await connection.execute(
                """
                UPDATE siwa.accounts SET token_checked_at = now() - interval '25 hours'
                 WHERE client_id = \(clientID) AND sub = \(sub) AND token_checked_at IS NOT NULL
                """)
            return try await scheduler.queueBatch()
        }
        return "scheduler queued \(queued)"
    }

    // MARK: Workers

    /// The `pick`-th available Apple job of the account in claim order (wrapping), claimed.
    private func claim(pick: Int) async throws -> Job? {
        let ids = try await connection.query(
            """
            SELECT id FROM siwa.jobs
             WHERE client_id = \(clientID) AND kind <> 'notification' AND state = 'available'
             ORDER BY priority, run_at, id
            """
        ).map { try $0.decode(Int64.self, at: 0) }
        guard !ids.isEmpty else { return nil }
        return try await world.harness.claim(ids[pick % ids.count], on: connection)
    }

    /// The worker holding `job` is gone: its lease runs out and the queue's rescue hands the job back.
    private func expireLease(of job: Job) async throws {
        _ = try await connection.execute(
            "UPDATE siwa.jobs SET locked_until = now() - interval '1 second' WHERE id = \(job.id) AND state = 'running'")
        _ = try await world.queue.rescueExpired()
    }

    private func startSlowWork(pick: Int, answer: AppleAnswer) async throws -> String {
        guard inFlight == nil else { return "a call is already in flight" }
        guard let job = try await claim(pick: pick) else { return "no Apple job" }
        let (world, clientID) = (world, clientID)
        let holds = ModelWorld.endpoints(of: job.kind).map { world.fake.holdNextCall(endpoint: $0, clientID: clientID) }
        let finished = LockedBox(false)
        let task = Task {
            defer { finished.value = true }
            return try await world.execute(job, answer: .ok, clientID: clientID)
        }
        // Until the call reaches Apple (or the job ends without calling Apple): bounded.
        let deadline = ContinuousClock.now + .seconds(30)
        while !finished.value, !holds.contains(where: \.hasArrived) {
            guard ContinuousClock.now < deadline else { throw HarnessError(message: "held call never arrived") }
            try await Task.sleep(for: .milliseconds(2))
        }
        // Only the first call is held: the others go through (another job's call must not wait).
        for hold in holds where !hold.hasArrived { hold.release() }
        guard holds.contains(where: \.hasArrived) else {
            return try await task.value + " (no Apple call to hold)"
        }
        inFlight = InFlight(task: task, holds: holds, answer: answer, finished: finished)
        return "\(job.kind.rawValue) job \(job.id) attempt \(job.attempt) waiting for Apple"
    }

    private func releaseInFlight(answering override: AppleAnswer?) async throws -> String {
        guard let inFlight else { return "nothing in flight" }
        self.inFlight = nil
        let answer = override ?? inFlight.answer
        // A held call is answered from the fake's side; Apple hanging becomes its gateway's 504.
        let failure: FakeAppleFailure? = answer == .timeout ? .status(504) : ModelWorld.failure(for: answer)
        for hold in inFlight.holds {
            if hold.hasArrived { hold.release(answering: failure) } else { hold.release() }
        }
        let what = try await inFlight.task.value
        if what.contains("timeout") {
            violations.append(.init(.harness, "held call timed out at the client", what))
        }
        return what
    }

    private func resumeStalled(answer: AppleAnswer) async throws -> String {
        guard let job = stalled else { return "no stalled worker" }
        stalled = nil
        return try await world.execute(job, answer: answer, clientID: clientID)
    }

    // MARK: Quiescence

    /// Lets every call in flight answer and every stalled worker go on, then runs the account's
    /// jobs (Apple answering 200), with time moved on so backoffs and pauses are over, until none
    /// is left. Bounded: a job that never finishes is a violation, not a hang.
    private func quiesce() async throws {
        if inFlight != nil {
            let what = try await releaseInFlight(answering: .ok)
            trace.append("end: " + what)
            try await observeStoredToken(after: Self.doer(of: what) ?? "call in flight")
        }
        if stalled != nil {
            let what = try await resumeStalled(answer: .ok)
            trace.append("end: " + what)
            try await observeStoredToken(after: Self.doer(of: what) ?? "stalled worker")
        }
        for _ in 0..<200 {
            _ = try await connection.execute(
                """
                UPDATE siwa.jobs SET run_at = now()
                 WHERE client_id = \(clientID) AND kind <> 'notification' AND state = 'available' AND run_at > now()
                """)
            _ = try await connection.execute("UPDATE siwa.paused_clients SET next_probe_at = now() WHERE client_id = \(clientID)")
            let notifications = try await applyNotifications(onlyOldest: false)
            if notifications != "nothing pending" {
                trace.append("end: notifications: \(notifications)")
                try await observeStoredToken(after: "notification worker")
            }
            if let job = try await claim(pick: 0) {
                let what = try await world.execute(job, answer: .ok, clientID: clientID)
                trace.append("end: " + what)
                try await observeStoredToken(after: Self.doer(of: what) ?? "a job")
                continue
            }
            let open = try await connection.query(
                """
                SELECT count(*)::int FROM siwa.jobs
                 WHERE client_id IN (\(clientID), \(notificationClientID)) AND state IN ('available', 'running')
                """
            )[0].decode(Int.self, at: 0)
            if open == 0 { return }
            if notifications == "nothing pending" {
                violations.append(.init(.quiescence, "job left running", "\(open) jobs available or running with nothing to run"))
                return
            }
        }
        violations.append(.init(.quiescence, "no quiescence", "jobs still open after 200 rounds"))
    }

    // MARK: Observations

    func status(on connection: PostgresConnection? = nil) async throws -> String? {
        try await (connection ?? self.connection).query(
            "SELECT status FROM siwa.accounts WHERE client_id = \(clientID) AND sub = \(sub)"
        ).first?.decode(String.self, at: 0)
    }

    private func latestChangeID() async throws -> Int64 {
        try await connection.query(
            "SELECT coalesce(max(id), 0) FROM siwa.account_changes WHERE client_id = \(clientID) AND sub = \(sub)"
        )[0].decode(Int64.self, at: 0)
    }

    /// Notes the tokens the account holds now; one held before and gone now was dropped by `doer`.
    private func observeStoredToken(after doer: String) async throws {
        let held = try await heldTokens()
        for previous in storedNow.subtracting(held) where dropped[previous] == nil { dropped[previous] = doer }
        everStored.formUnion(held)
        storedNow = held
    }

    /// "exchange job" for a job's result ("exchange job 12 attempt 1: ...").
    static func doer(of what: String) -> String? {
        let words = what.split(separator: " ", maxSplits: 2)
        return words.count > 1 && words[1] == "job" ? "\(words[0]) job" : nil
    }

    /// The refresh tokens the account holds now, decrypted: the current one, and any the schema
    /// keeps for a later deletion to revoke (`retired_tokens_enc`, when the column exists).
    func heldTokens() async throws -> Set<String> {
        let rows = try await connection.query(
            """
            SELECT refresh_token_enc, coalesce((to_jsonb(a) -> 'retired_tokens_enc')::text, '[]') AS retired
              FROM siwa.accounts a WHERE client_id = \(clientID) AND sub = \(sub)
            """)
        guard let row = rows.first else { return [] }
        var sealed: [[UInt8]] = try row.decode([UInt8]?.self, column: "refresh_token_enc").map { [$0] } ?? []
        // bytea in jsonb: "\\x0a1b..." strings.
        let retired = (try? JSONSerialization.jsonObject(with: Data(try row.decode(String.self, column: "retired").utf8))) as? [String]
        sealed += (retired ?? []).compactMap { Self.bytes(hex: $0.hasPrefix("\\x") ? String($0.dropFirst(2)) : $0) }
        return Set(sealed.compactMap { try? world.harness.tokenBox.open($0, clientID: clientID, sub: sub) })
    }

    static func bytes(hex: String) -> [UInt8]? {
        let digits = Array(hex.utf8)
        guard digits.count % 2 == 0 else { return nil }
        return stride(from: 0, to: digits.count, by: 2).map { index -> UInt8? in
            UInt8(String(decoding: digits[index..<index + 2], as: UTF8.self), radix: 16)
        }.reduce(into: [UInt8]?([])) { result, byte in
            if let byte { result?.append(byte) } else { result = nil }
        }
    }
}

extension ModelStep {
    /// The kind of step, with Apple's answer where it has one (for the exercised counts).
    var category: String {
        switch self {
        case .app(let calls): "app: " + calls.map(\.description).joined(separator: " + ")
        case .notify(let kind, let back): "notify \(kind.rawValue)" + (back == nil ? "" : " (earlier)")
        case .applyNotifications: "notification worker"
        case .work(_, let answer): "worker, Apple answers \(answer)"
        case .slowWork(_, let answer): "worker, Apple slow then \(answer)"
        case .release: "slow answer arrives"
        case .crash: "worker dies"
        case .stall: "worker stalls"
        case .resumeStalled(let answer): "stalled worker resumes, Apple answers \(answer)"
        case .reconcile: "reconcile queued"
        case .userRevokesAtApple: "user ends grants at Apple"
        }
    }
}

extension AppCall {
    var isLink: Bool { if case .link = self { true } else { false } }

    func takesCode(deletionWithCode: Bool) -> Bool {
        switch self {
        case .link: true
        case .requestDeletion(let withCode): withCode && deletionWithCode
        }
    }
}

/// A broken rule: `key` (rule and kind) tells distinct defects apart; `detail` is for the report.
struct ModelViolation: Hashable, Sendable {
    var rule: ModelRule
    var kind: String
    var detail: String

    init(_ rule: ModelRule, _ kind: String, _ detail: String) {
        self.rule = rule
        self.kind = kind
        self.detail = detail
    }

    var key: String { "\(rule.rawValue): \(kind)" }
}

enum ModelRule: String, Hashable, Sendable, CaseIterable {
    case deletionEndsDeleted = "every requested deletion ends deleted"
    case tokensRevoked = "no refresh token outlives a deletion unrevoked"
    case deletedStaysDeleted = "deleted stays deleted under notifications"
    case notificationOnce = "no notification applied twice"
    case emailNewest = "email forwarding ends at the newest event"
    case endingEventsApply = "consent-revoked and account-deleted end the account's life"
    case causalChanges = "the app's change rows come in causal order"
    case exchangeNeverLost = "a successful exchange is never lost"
    case linkBlockedWhilePending = "a pending deletion blocks a new link"
    case appCall = "app calls succeed"
    case quiescence = "every job finishes"
    case harness = "the test harness itself"
}
