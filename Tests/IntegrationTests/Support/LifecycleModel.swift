import Foundation

/// The steps of the lifecycle model test (`LifecycleModelTests`): what the app, Apple, the user
/// and the workers can do to one account, in any order.
///
/// Every step is a no-op when it does not apply (no job to run, no call in flight), so any
/// subsequence of a sequence is itself a valid sequence: that is what lets the shrinker cut a
/// failing sequence down to the few steps that matter.
enum ModelStep: Hashable, Sendable, CustomStringConvertible {
    /// One app transaction making these calls, in order.
    case app([AppCall])
    /// Apple notifies about the account. `stepsBack` nil: the event happened now (later than every
    /// earlier one); else it happened just before the step that many steps back (before the
    /// sequence, when that is past its start). Times anchored to steps, not to milliseconds, keep a
    /// sequence's outcome the same on a fast or a loaded machine.
    case notify(NotificationKind, stepsBack: Int?)
    /// The notification worker runs the account's pending notifications (all, or only the oldest).
    case applyNotifications(onlyOldest: Bool)
    /// A worker claims the account's `pick`-th available Apple job (claim order) and runs it; Apple
    /// answers its call with `answer`.
    case work(pick: Int, answer: AppleAnswer)
    /// As `work`, but Apple's answer stays in flight until `release` (or the end): other steps run
    /// while the job waits for Apple.
    case slowWork(pick: Int, answer: AppleAnswer)
    case release
    /// A worker claims the job and dies before calling Apple; its lease expires and is rescued.
    case crash(pick: Int)
    /// A worker claims the job and stalls; its lease expires and is rescued; the stalled worker
    /// carries on at `resumeStalled`, with Apple answering `answer`.
    case stall(pick: Int)
    case resumeStalled(AppleAnswer)
    /// The reconciliation scheduler finds the account's token due for a check.
    case reconcile
    /// The user withdraws consent in Settings: Apple ends the grants issued so far (Apple's
    /// notification, if any, is a separate step).
    case userRevokesAtApple
    /// The user signs in through the app API (`POST /v1/sign-in`: nonce, identity token, with a
    /// fresh authorization code or without); Apple answers the exchange, if one is made, with `answer`.
    case signIn(withCode: Bool, answer: AppleAnswer)
    /// As `signIn` with a code, but Apple's answer to the exchange stays in flight until `release`:
    /// the sign-in has read the account, and other steps run before it writes.
    case slowSignIn(answer: AppleAnswer)
    /// The operator runs `siwa accounts import` with a refresh token from the app's old store,
    /// issued before the sequence began (so every grant the user ended since has ended it too).
    case importToken
    /// A sign-in with a code whose exchange Apple answers with a token but an `id_token` Apple never
    /// signed: the sign-in refuses it (400 `code_invalid`) after the exchange, and must not drop the
    /// token: Apple answers its revoke with `revoke` (a 503 leaves it to a retried job).
    case signInRefusedAfterExchange(revoke: AppleAnswer)
    /// The browser half of a web or Android sign-in: the receiver's state and nonce, then Apple's
    /// `form_post` to the callback (a fresh code bound to the callback's redirect URI) leave a ticket
    /// for the app's back end to redeem, at `redeemTicket`, however many steps later.
    case webTicket
    /// The app's back end redeems the oldest ticket not yet redeemed (`POST /v1/sign-in {"ticket"}`),
    /// Apple answering its exchange with `answer`; `twice`: two redemptions of the same ticket at
    /// once (exactly one signs in, the other is 401 `ticket_invalid`). The sign-in reads the account
    /// when it is redeemed: a deletion requested since the ticket was made refuses it.
    case redeemTicket(answer: AppleAnswer, twice: Bool)

    var description: String {
        switch self {
        case .app(let calls): "app transaction [\(calls.map(\.description).joined(separator: "; "))]"
        case .notify(let kind, let back):
            "notify \(kind.rawValue) " + (back.map { "(event_time just before the step \($0) back)" } ?? "(now, the newest)")
        case .applyNotifications(let oldest): oldest ? "notification worker: oldest pending only" : "notification worker: all pending"
        case .work(let pick, let answer): "worker runs Apple job #\(pick); Apple answers \(answer)"
        case .slowWork(let pick, let answer): "worker runs Apple job #\(pick); Apple's answer (\(answer)) stays in flight"
        case .release: "Apple's answer in flight arrives"
        case .crash(let pick): "worker claims Apple job #\(pick) and dies; lease expires, job rescued"
        case .stall(let pick): "worker claims Apple job #\(pick) and stalls; lease expires, job rescued"
        case .resumeStalled(let answer): "stalled worker resumes; Apple answers \(answer)"
        case .reconcile: "reconcile scheduler: token check due"
        case .userRevokesAtApple: "user withdraws consent at Apple (grants end)"
        case .signIn(let withCode, let answer):
            "app API sign-in " + (withCode ? "with a fresh code; Apple answers the exchange \(answer)" : "without a code")
        case .slowSignIn(let answer): "app API sign-in with a fresh code; Apple's answer to the exchange (\(answer)) stays in flight"
        case .importToken: "operator imports a refresh token from the app's old store (siwa accounts import)"
        case .signInRefusedAfterExchange(let revoke):
            "app API sign-in with a fresh code; Apple answers the exchange with an unverifiable id_token and the revoke \(revoke)"
        case .webTicket: "web sign-in in a browser: state, Apple's form_post, a ticket kept"
        case .redeemTicket(let answer, let twice):
            "app back end redeems the oldest ticket\(twice ? " twice at once" : ""); Apple answers the exchange \(answer)"
        }
    }
}

enum AppCall: Hashable, Sendable, CustomStringConvertible {
    /// `siwa.link_account` with a fresh code from the fake; `longUserID`: an `app_user_id` of 8,000
    /// characters (the app stores what it likes there).
    case link(longUserID: Bool)
    /// `siwa.request_deletion`, with a fresh code or without.
    case requestDeletion(withCode: Bool)
    /// Not an app transaction: a sign-in through the app API, placed among the app's calls where
    /// it read the account (a deletion committed after that read wins). `accepted`: it answered 200.
    case signIn(accepted: Bool)
    /// `siwa.link_account` under the other client ID of the user's app group (the primary App ID
    /// Apple notifies, when the sequence is grouped; the same client ID otherwise).
    case linkInGroup

    var description: String {
        switch self {
        case .link(let long): long ? "link_account(fresh code, 8000-character app_user_id)" : "link_account(fresh code)"
        case .requestDeletion(let withCode): withCode ? "request_deletion(fresh code)" : "request_deletion()"
        case .signIn(let accepted): accepted ? "app API sign-in (200)" : "app API sign-in (refused)"
        case .linkInGroup: "link_account(fresh code) under the group's other client ID"
        }
    }
}

enum NotificationKind: String, Hashable, Sendable, CaseIterable {
    case consentRevoked = "consent-revoked"
    case accountDeleted = "account-deleted"
    case emailEnabled = "email-enabled"
    case emailDisabled = "email-disabled"

    /// Whether Apple ends the user's grants with this event.
    var endsGrants: Bool { self == .consentRevoked || self == .accountDeleted }
}

enum AppleAnswer: String, Hashable, Sendable, CaseIterable, CustomStringConvertible {
    case ok = "200"
    case invalidGrant = "invalid_grant"
    case unavailable = "503"
    case timeout
    case invalidClient = "invalid_client"

    var description: String { rawValue }
}

/// Seeded sequences: the same seed gives the same steps on every machine.
struct ModelGenerator {
    /// Whether `siwa.request_deletion(client_id, sub, authorization_code)` exists to be called.
    var deletionWithCode: Bool

    func sequence(seed: UInt64) -> [ModelStep] {
        var random = SeededGenerator(seed: seed)
        let length = Int.random(in: 3...20, using: &random)
        var steps: [ModelStep] = []
        var inFlight = false
        var stalled = false
        for _ in 0..<length {
            let step = nextStep(&random, inFlight: inFlight, stalled: stalled)
            switch step {
            case .slowWork: inFlight = true
            case .release: inFlight = false
            case .stall: stalled = true
            case .resumeStalled: stalled = false
            default: break
            }
            steps.append(step)
        }
        return steps
    }

    private func nextStep(_ random: inout SeededGenerator, inFlight: Bool, stalled: Bool) -> ModelStep {
        let roll = Int.random(in: 0..<122, using: &random)
        switch roll {
        case 0..<20:
            let count = Int.random(in: 0..<10, using: &random) < 7 ? 1 : 2
            return .app((0..<count).map { _ in appCall(&random) })
        case 20..<35:
            let kind = NotificationKind.allCases.randomElement(using: &random)!
            let back = Int.random(in: 0..<3, using: &random) == 0 ? Int.random(in: 1...6, using: &random) : nil
            return .notify(kind, stepsBack: back)
        case 35..<45:
            return .applyNotifications(onlyOldest: Int.random(in: 0..<3, using: &random) == 0)
        case 45..<72:
            return .work(pick: pick(&random), answer: answer(&random))
        case 72..<82:
            // Apple answering late is where the races are: more of it than of the rest.
            return inFlight ? .release : .slowWork(pick: pick(&random), answer: answer(&random))
        case 82..<85:
            return inFlight ? .release : .work(pick: pick(&random), answer: .ok)
        case 85..<88:
            return .crash(pick: pick(&random))
        case 88..<93:
            return stalled ? .resumeStalled(answer(&random)) : .stall(pick: pick(&random))
        case 93..<98:
            return .reconcile
        case 98..<100:
            return .userRevokesAtApple
        case 100..<106:
            return .signIn(withCode: Int.random(in: 0..<10, using: &random) < 8, answer: answer(&random))
        case 106..<110:
            return inFlight ? .release : .slowSignIn(answer: answer(&random))
        case 110..<113:
            return .importToken
        case 113..<116:
            return .signInRefusedAfterExchange(revoke: Int.random(in: 0..<2, using: &random) == 0 ? .ok : .unavailable)
        case 116..<118:
            return .webTicket
        default:
            return .redeemTicket(answer: answer(&random), twice: Int.random(in: 0..<4, using: &random) == 0)
        }
    }

    private func appCall(_ random: inout SeededGenerator) -> AppCall {
        let roll = Int.random(in: 0..<100, using: &random)
        if roll < 10 { return .linkInGroup }
        if roll < 62 { return .link(longUserID: Int.random(in: 0..<100, using: &random) < 8) }
        return .requestDeletion(withCode: deletionWithCode && Int.random(in: 0..<10, using: &random) < 3)
    }

    /// Mostly the first job in claim order; sometimes a later one (another worker got there first).
    private func pick(_ random: inout SeededGenerator) -> Int {
        Int.random(in: 0..<10, using: &random) < 6 ? 0 : Int.random(in: 1...2, using: &random)
    }

    private func answer(_ random: inout SeededGenerator) -> AppleAnswer {
        switch Int.random(in: 0..<100, using: &random) {
        case 0..<58: .ok
        case 58..<70: .unavailable
        case 70..<76: .timeout
        case 76..<88: .invalidGrant
        default: .invalidClient
        }
    }

    /// Whether the sequence of `seed` links its account under a Services ID grouped with the App ID
    /// Apple notifies (one in four).
    static func isGrouped(seed: UInt64) -> Bool { seed % 4 == 0 }

    /// The seed of sequence `index` of a run seeded with `seed` (SplitMix64's mixing of both).
    static func sequenceSeed(run seed: UInt64, index: Int) -> UInt64 {
        var mixer = SeededGenerator(seed: seed ^ (UInt64(index) &* 0x9E37_79B9_7F4A_7C15))
        return mixer.next()
    }
}

/// Delta debugging over steps: drops chunks, then simplifies single steps, keeping every change
/// after which the sequence still fails the same way. Bounded by `budget` replays.
struct ModelShrinker {
    var budget: Int
    let stillFails: ([ModelStep]) async -> Bool

    mutating func shrink(_ steps: [ModelStep]) async -> [ModelStep] {
        var current = steps
        // A simpler step can make others no-ops (a slow call made plain leaves its release idle):
        // cut again after every round of simplification that changed something.
        while budget > 0 {
            current = await removeSteps(current)
            let simpler = await simplifySteps(current)
            if simpler == current { break }
            current = simpler
        }
        return current
    }

    private mutating func removeSteps(_ steps: [ModelStep]) async -> [ModelStep] {
        var current = steps
        var chunk = max(1, current.count / 2)
        while budget > 0 {
            var index = 0
            var removed = false
            while index < current.count, budget > 0 {
                var candidate = current
                candidate.removeSubrange(index..<min(current.count, index + chunk))
                if await attempt(candidate) {
                    current = candidate
                    removed = true
                } else {
                    index += chunk
                }
            }
            if chunk == 1 && !removed { break }
            if !removed { chunk = max(1, chunk / 2) }
        }
        return current
    }

    private mutating func simplifySteps(_ steps: [ModelStep]) async -> [ModelStep] {
        var current = steps
        var index = 0
        while index < current.count, budget > 0 {
            for simpler in Self.simplifications(of: current[index]) where budget > 0 {
                var candidate = current
                candidate[index] = simpler
                if await attempt(candidate) {
                    current = candidate
                    break
                }
            }
            index += 1
        }
        return current
    }

    private mutating func attempt(_ candidate: [ModelStep]) async -> Bool {
        budget -= 1
        return await stillFails(candidate)
    }

    static func simplifications(of step: ModelStep) -> [ModelStep] {
        switch step {
        case .app(let calls) where calls.count > 1: calls.map { .app([$0]) }
        case .app([.requestDeletion(withCode: true)]): [.app([.requestDeletion(withCode: false)])]
        case .app([.link(longUserID: true)]): [.app([.link(longUserID: false)])]
        case .notify(let kind, .some(let back)): (back > 1 ? [.notify(kind, stepsBack: 1)] : []) + [.notify(kind, stepsBack: nil)]
        case .applyNotifications(true): [.applyNotifications(onlyOldest: false)]
        case .work(let pick, let answer) where pick != 0 || answer != .ok:
            [.work(pick: 0, answer: answer), .work(pick: pick, answer: .ok)].filter { $0 != step }
        case .slowWork(let pick, let answer):
            [.work(pick: pick, answer: answer), .slowWork(pick: 0, answer: answer), .slowWork(pick: pick, answer: .ok)]
                .filter { $0 != step }
        case .crash(let pick) where pick != 0: [.crash(pick: 0)]
        case .stall(let pick) where pick != 0: [.stall(pick: 0)]
        case .resumeStalled(let answer) where answer != .ok: [.resumeStalled(.ok)]
        case .signIn(let withCode, let answer) where !withCode || answer != .ok:
            [.signIn(withCode: true, answer: answer), .signIn(withCode: withCode, answer: .ok)].filter { $0 != step }
        case .slowSignIn(let answer):
            [.signIn(withCode: true, answer: answer)] + (answer != .ok ? [.slowSignIn(answer: .ok)] : [])
        case .signInRefusedAfterExchange(let revoke) where revoke != .ok: [.signInRefusedAfterExchange(revoke: .ok)]
        case .app([.linkInGroup]): [.app([.link(longUserID: false)])]
        case .redeemTicket(let answer, let twice) where twice || answer != .ok:
            [.redeemTicket(answer: answer, twice: false), .redeemTicket(answer: .ok, twice: twice)].filter { $0 != step }
        default: []
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
        case .signIn(let withCode, let answer): withCode ? "sign-in, Apple answers \(answer)" : "sign-in without a code"
        case .slowSignIn(let answer): "sign-in, Apple slow then \(answer)"
        case .importToken: "token imported"
        case .signInRefusedAfterExchange(let revoke): "sign-in refused after its exchange, revoke answers \(revoke)"
        case .webTicket: "web ticket kept"
        case .redeemTicket(let answer, let twice): "ticket redeemed\(twice ? " twice at once" : ""), Apple answers \(answer)"
        }
    }
}

extension AppCall {
    /// A call after which the account lives again: `link_account`, or a sign-in that was accepted.
    var isLink: Bool {
        switch self {
        case .link, .linkInGroup, .signIn(accepted: true): true
        default: false
        }
    }

    var isDeletion: Bool { if case .requestDeletion = self { true } else { false } }

    func takesCode(deletionWithCode: Bool) -> Bool {
        switch self {
        case .link, .linkInGroup: true
        case .requestDeletion(let withCode): withCode && deletionWithCode
        case .signIn: false  // its code comes with the identity token (ModelRun.signIn)
        }
    }
}
