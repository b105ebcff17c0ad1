import FakeApple
import Foundation
import JobQueue
import Postgres
import AppleJobs
import TestTiming
import StoredTokens

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
    /// The sequence's app API, started at its first sign-in.
    private var appAPI: ModelAppAPI?
    private var importCount = 0
    /// When each sign-in (by its place in `committed`) read the account.
    private var signInStarts: [Int: Date] = [:]
    /// When the last sign-in accepted with a code that Apple exchanged read the account.
    private(set) var lastExchangedSignIn: Date?
    /// Web sign-in tickets kept and not yet redeemed, oldest first, with the code each carries.
    private var tickets: [(ticket: String, code: String)] = []
    /// Every time before which the user's grants ended at Apple (`endGrants`).
    private(set) var grantEnds: [Date] = []

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
        /// The status of the account under the group's other client ID just before the call (grouped
        /// sequences only): a deletion covers it too.
        var otherStatusBefore: String? = nil
    }

    private struct InFlight {
        var task: Task<String, any Error>
        var holds: [FakeAppleHeldCall]
        var answer: AppleAnswer
        var finished: LockedBox<Bool>
        /// A sign-in waiting for Apple: its place in `committed`, settled when it answers.
        var signIn: Int? = nil
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
        await appAPI?.shutDown()
    }

    private static let noOps = [
        "no Apple job", "nothing in flight", "nothing pending", "no stalled worker", "scheduler queued 0",
        "a call is already in flight", "a worker is already stalled", "no ticket",
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
            noteGrantEnd(job, answer: answer)
            return try await world.execute(job, answer: answer, clientID: job.clientID)
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
            endGrants(issuedBefore: stepStarts[index])
            return "grants ended at Apple"
        case .signIn(let withCode, let answer): return try await signIn(withCode: withCode, answer: answer)
        case .slowSignIn(let answer): return try await startSlowSignIn(answer: answer)
        case .importToken: return try await importToken()
        case .signInRefusedAfterExchange(let revoke): return try await signInRefusedAfterExchange(revoke: revoke)
        case .webTicket:
            let kept = try await WebTicket.make(connection: connection, fake: world.fake, sub: sub, clientID: clientID)
            tickets.append(kept)
            return "ticket kept (\(tickets.count) unredeemed)"
        case .redeemTicket(let answer, let twice): return try await redeemTicket(answer: answer, twice: twice)
        }
    }

    private func app(_ calls: [AppCall]) async throws -> String {
        var attempted: [CommittedCall] = []
        var outcome: [String] = []
        do {
            try await connection.withTransaction { connection in
                for call in calls {
                    let own = try await self.status(on: connection)
                    let other = grouped ? try await self.status(of: notificationClientID, on: connection) : nil
                    // A deletion pending under either client ID of the group blocks a link under both.
                    let before = call.isLink && other == "pending_deletion" ? "pending_deletion" : own
                    var code: String?
                    if call.takesCode(deletionWithCode: world.deletionWithCode) {
                        code = world.fake.registerCode(
                            clientID: call == .linkInGroup ? notificationClientID : clientID, sub: sub,
                            email: "\(sub)@privaterelay.appleid.com", isPrivateEmail: true)
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
                    attempted.append(
                        CommittedCall(call: call, code: code, statusBefore: own, changeMark: 0, jobID: job, otherStatusBefore: other))
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
            // Each link's own: a deleted life's app_user_id must never come back (LifecycleModelChecks).
            let appUserID = long ? "user-\(linkCount)-" + String(repeating: "u", count: 8000) : "user-\(linkCount)"
            return try await connection.query(
                "SELECT siwa.link_account(\(clientID), \(sub), \(appUserID), \(code))")[0].decode(Int64.self, at: 0)
        case .linkInGroup:
            linkCount += 1
            return try await connection.query(
                "SELECT siwa.link_account(\(notificationClientID), \(sub), \("user-\(linkCount)"), \(code))")[0].decode(Int64.self, at: 0)
        case .signIn:
            throw HarnessError(message: "a sign-in is not an app transaction's call")
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
        if kind.endsGrants { endGrants(issuedBefore: time) }
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
             WHERE client_id IN (\(clientID), \(notificationClientID))
               AND kind = ANY (\(world.handlers.keys.map(\.rawValue))::text[])
               AND state = 'available'
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
        // The third expiry discards the job as `process_died` (ProcessDiedTests); in the model an
        // operator then retries it at once, so the rest of the run sees the job as before that rule.
        // Any lane's rescue may be the one that takes it (the rescue is queue-wide, and skips a job
        // another rescue holds): wait until some rescue has, then read its state from the row.
        _ = try await world.queue.rescueExpired()
        var state = "running"
        try await waitUntil("job \(job.id) rescued by some lane's rescue", timeout: .seconds(10)) {
            state = try await connection.query("SELECT state FROM siwa.jobs WHERE id = \(job.id)")[0].decode(String.self, at: 0)
            return state != "running"
        }
        if state == "discarded" {
            _ = try await JobAdministration(connection: connection).retry(.id(job.id))
        }
    }

    private func startSlowWork(pick: Int, answer: AppleAnswer) async throws -> String {
        guard inFlight == nil else { return "a call is already in flight" }
        guard let job = try await claim(pick: pick) else { return "no Apple job" }
        let (world, clientID) = (world, job.clientID)
        let holds = ModelWorld.endpoints(of: job.kind).map { world.fake.holdNextCall(endpoint: $0, clientID: clientID) }
        let finished = LockedBox(false)
        let task = Task {
            defer { finished.value = true }
            return try await world.execute(job, answer: .ok, clientID: clientID)
        }
        // Until the call reaches Apple (or the job ends without calling Apple): bounded.
        try await waitUntil("the held call arrived, or the job ended", timeout: .seconds(30), every: .milliseconds(2)) {
            finished.value || holds.contains(where: \.hasArrived)
        }
        // Only the first call is held: the others go through (another job's call must not wait).
        for hold in holds where !hold.hasArrived { hold.release() }
        guard holds.contains(where: \.hasArrived) else {
            return try await task.value + " (no Apple call to hold)"
        }
        noteGrantEnd(job, answer: answer)  // the fake ends what was issued before the call arrived: now
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
        if let index = inFlight.signIn { settleSignIn(at: index, what, withCode: true, answer: answer) }
        return what
    }

    /// Apple answering `invalid_grant` to a call with a refresh token says the user ended their
    /// grants (the fake ends every token issued before the call): the model counts it as a grant end.
    private func noteGrantEnd(_ job: Job, answer: AppleAnswer) {
        if answer == .invalidGrant, job.kind == .revoke || job.kind == .reconcile { grantEnds.append(Date()) }
    }

    private func endGrants(issuedBefore time: Date) {
        grantEnds.append(time)
        world.fake.userEndedGrants(clientID: clientID, sub: sub, issuedBefore: time)
    }

    /// `siwa accounts import` of one line: a token Apple issued before the sequence began, dead if
    /// the user ended their grants at any point so far.
    private func importToken() async throws -> String {
        importCount += 1
        let token = "imported-\(clientID)-\(importCount)"
        // Dated before the sequence: dead at the fake if any grant ended since (the user's or Apple's).
        world.fake.registerRefreshToken(token, clientID: clientID, sub: sub, issuedAt: stepStarts[0].addingTimeInterval(-60))
        let summary = try await AccountImporter(connection: connection, tokenBox: world.harness.tokenBox)
            .run(lines: ["\(clientID),\(sub),user-imported,\(token)"])
        return "import: \(summary.imported) imported, \(summary.skipped) skipped"
    }

    // MARK: Sign-in through the app API

    /// A sign-in, placed among the app's calls where it reads the account (before the request: no
    /// other step runs meanwhile). Apple's answer to an exchange is injected for the request only.
    private func signIn(withCode: Bool, answer: AppleAnswer) async throws -> String {
        let api = try await startedAppAPI()
        let (body, code) = try await api.prepare(withCode: withCode)
        if withCode, let failure = Self.exchangeFailure(answer) {
            world.fake.injectFailures(endpoint: "token", clientID: clientID, responses: [failure])
        }
        let before = try await status()
        let index = placeSignIn(code: code)
        let signedIn = try await api.signInAnswer(body)
        // An answer no exchange took (the account held a token) must not reach a later job.
        world.fake.clearFailures(clientID: clientID)
        settleSignIn(at: index, signedIn, before: before, withCode: withCode, answer: answer)
        return signedIn.what
    }

    /// The app's back end redeems the oldest ticket (once, or twice at once): exactly one
    /// redemption signs in, any other is 401 `ticket_invalid`; the one that does is judged as any
    /// sign-in with a code.
    private func redeemTicket(answer: AppleAnswer, twice: Bool) async throws -> String {
        guard !tickets.isEmpty else { return "no ticket" }
        let (ticket, code) = tickets.removeFirst()
        let api = try await startedAppAPI()
        if let failure = Self.exchangeFailure(answer) {
            world.fake.injectFailures(endpoint: "token", clientID: clientID, responses: [failure])
        }
        let before = try await status()
        let index = placeSignIn(code: code)
        let answers: [ModelAppAPI.SignInAnswer]
        if twice {
            async let first = api.signInAnswer(["ticket": ticket])
            async let second = api.signInAnswer(["ticket": ticket])
            answers = try await [first, second]
        } else {
            answers = [try await api.signInAnswer(["ticket": ticket])]
        }
        world.fake.clearFailures(clientID: clientID)
        let spent = "sign-in 401 ticket_invalid"
        let redeemed = answers.filter { $0.what != spent }
        guard redeemed.count == 1, let signedIn = redeemed.first else {
            violations.append(
                .init(.appCall, "a ticket redeemed \(answers.count)x signed in \(redeemed.count)x", answers.map(\.what).joined(separator: "; ")))
            return answers.map(\.what).joined(separator: "; ")
        }
        settleSignIn(at: index, signedIn, before: before, withCode: true, answer: answer)
        return signedIn.what + (twice ? "; the same ticket again: \(spent)" : "")
    }

    /// A sign-in whose exchange gives a token with an `id_token` Apple never signed: refused after
    /// the exchange; the token it obtained must be revoked (Apple answering the first revoke `revoke`).
    private func signInRefusedAfterExchange(revoke: AppleAnswer) async throws -> String {
        let api = try await startedAppAPI()
        let (body, code) = try await api.prepare(withCode: true)
        world.fake.injectFailures(endpoint: "token", clientID: clientID, responses: [.badSignature])
        if let failure = ModelWorld.failure(for: revoke) {
            world.fake.injectFailures(endpoint: "revoke", clientID: clientID, responses: [failure])
        }
        let index = placeSignIn(code: code)
        let what = try await api.signIn(body)
        world.fake.clearFailures(clientID: clientID)
        // Apple's answer to the first revoke of that token, wherever it is made (a job, later).
        if let failure = ModelWorld.failure(for: revoke) {
            world.fake.injectFailures(endpoint: "revoke", clientID: clientID, responses: [failure])
        }
        committed[index].call = .signIn(accepted: ModelSignInRule.accepted(what))
        if what != "sign-in 400 code_invalid" && what != "sign-in 403 account_deleting" {
            violations.append(.init(.appCall, "sign-in with an unverifiable exchange answered \(what)", what))
        }
        return what
    }

    /// A sign-in whose exchange Apple holds: it has read the account when the call arrives, and
    /// writes only after `release`.
    private func startSlowSignIn(answer: AppleAnswer) async throws -> String {
        guard inFlight == nil else { return "a call is already in flight" }
        let api = try await startedAppAPI()
        let (body, code) = try await api.prepare(withCode: true)
        let hold = world.fake.holdNextCall(endpoint: "token", clientID: clientID)
        let index = placeSignIn(code: code)
        let finished = LockedBox(false)
        let task = Task {
            defer { finished.value = true }
            return try await api.signIn(body)
        }
        try await waitUntil("the sign-in's exchange reached Apple, or the sign-in ended", timeout: .seconds(30), every: .milliseconds(2)) {
            finished.value || hold.hasArrived
        }
        guard hold.hasArrived else {
            // Answered without an exchange (a token held, or a deletion pending).
            hold.release()
            let what = try await task.value
            settleSignIn(at: index, what, withCode: true, answer: .ok)
            return what + " (no exchange to hold)"
        }
        inFlight = InFlight(task: task, holds: [hold], answer: answer, finished: finished, signIn: index)
        return "sign-in waiting for Apple"
    }

    private func startedAppAPI() async throws -> ModelAppAPI {
        if let appAPI { return appAPI }
        let api = try await ModelAppAPI(world: world, clientID: clientID, sub: sub)
        appAPI = api
        return api
    }

    private func placeSignIn(code: String?) -> Int {
        committed.append(CommittedCall(call: .signIn(accepted: false), code: code, statusBefore: nil, changeMark: 0, jobID: 0))
        signInStarts[committed.count - 1] = Date()
        return committed.count - 1
    }

    private func settleSignIn(at index: Int, _ what: String, withCode: Bool, answer: AppleAnswer) {
        committed[index].call = .signIn(accepted: ModelSignInRule.accepted(what))
        if ModelSignInRule.accepted(what), withCode, answer == .ok { lastExchangedSignIn = signInStarts[index] }
        if let problem = ModelSignInRule.violation(what, withCode: withCode, answer: answer) {
            violations.append(.init(.appCall, "sign-in answered \(problem.split(separator: " ").first ?? "")", problem))
        }
    }

    /// As above, for a sign-in nothing else ran beside (from its read of the account, `before`, to
    /// its answer): a user whose account was deleted comes back as somebody new, never handed the
    /// old life's app_user_id.
    private func settleSignIn(at index: Int, _ signedIn: ModelAppAPI.SignInAnswer, before: String?, withCode: Bool, answer: AppleAnswer) {
        settleSignIn(at: index, signedIn.what, withCode: withCode, answer: answer)
        if ModelSignInRule.accepted(signedIn.what), before == "deleted" || before == "apple_account_deleted",
            signedIn.isNew != true || signedIn.appUserID != nil
        {
            violations.append(
                .init(
                    .forgotten, "sign-in after \(before ?? "") not a new user",
                    "the sign-in answered new \(signedIn.isNew.map(String.init) ?? "absent"), app_user_id \(signedIn.appUserID ?? "null")"))
        }
    }

    /// What the fake answers an exchange with; Apple hanging is its gateway's 504 (the API's own
    /// 5 s bound is covered by AppAPISignInTests).
    private static func exchangeFailure(_ answer: AppleAnswer) -> FakeAppleFailure? {
        answer == .timeout ? .status(504) : ModelWorld.failure(for: answer)
    }

    private func resumeStalled(answer: AppleAnswer) async throws -> String {
        guard let job = stalled else { return "no stalled worker" }
        stalled = nil
        noteGrantEnd(job, answer: answer)
        return try await world.execute(job, answer: answer, clientID: job.clientID)
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
        // Another lane's reconcile step queues checks for every account due, this one included
        // (an imported token has never been checked): a job can appear between this loop's claim
        // and its count. Only one still unclaimable on the next rounds is left running.
        var idleRounds = 0
        for _ in 0..<200 {
            _ = try await connection.execute(
                """
                UPDATE siwa.jobs SET run_at = now()
                 WHERE client_id = \(clientID) AND kind <> 'notification' AND state = 'available' AND run_at > now()
                """)
            _ = try await connection.execute(
                "UPDATE siwa.paused_clients SET next_probe_at = now() WHERE client_id IN (\(clientID), \(notificationClientID))")
            let notifications = try await applyNotifications(onlyOldest: false)
            if notifications != "nothing pending" {
                trace.append("end: notifications: \(notifications)")
                try await observeStoredToken(after: "notification worker")
            }
            if let job = try await claim(pick: 0) {
                let what = try await world.execute(job, answer: .ok, clientID: job.clientID)
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
            idleRounds = notifications == "nothing pending" ? idleRounds + 1 : 0
            if idleRounds >= 3 {
                let left = try await connection.query(
                    """
                    SELECT id || ' ' || kind || ' ' || state || ' run_at ' || coalesce(run_at::text, '-')
                           || ' locked_by ' || coalesce(locked_by, '-') || ' attempt ' || attempt
                      FROM siwa.jobs
                     WHERE client_id IN (\(clientID), \(notificationClientID)) AND state IN ('available', 'running')
                     ORDER BY id
                    """
                ).map { try $0.decode(String.self, at: 0) }
                violations.append(
                    .init(.quiescence, "job left running", "\(open) jobs available or running with nothing to run: \(left)"))
                return
            }
        }
        violations.append(.init(.quiescence, "no quiescence", "jobs still open after 200 rounds"))
    }

    // MARK: Observations

    func status(of client: String? = nil, on connection: PostgresConnection? = nil) async throws -> String? {
        try await (connection ?? self.connection).query(
            "SELECT status FROM siwa.accounts WHERE client_id = \(client ?? clientID) AND sub = \(sub)"
        ).first?.decode(String.self, at: 0)
    }

    /// Whether the account is linked under a Services ID grouped with the App ID Apple notifies.
    var grouped: Bool { clientID != notificationClientID }

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
}
