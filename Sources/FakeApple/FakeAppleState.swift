package import Foundation
import Locking

/// One call the fake answered, for `GET /fake/calls` and tests. Never holds a secret, code or token.
package struct FakeAppleCall: Sendable, Equatable, Codable {
    /// `token`, `revoke`, `keys` or `usermigrationinfo`.
    package var endpoint: String
    package var clientID: String?
    package var grantType: String?
    package var status: Int
    /// The OAuth `error` answered, if any.
    package var error: String?
    /// Whether the request carried a client_secret that passed every check.
    package var validClientSecret: Bool
    package var time: Date

    enum CodingKeys: String, CodingKey {
        case endpoint
        case clientID = "client_id"
        case grantType = "grant_type"
        case status, error
        case validClientSecret = "valid_client_secret"
        case time
    }
}

/// A refresh token the fake issued, as tests see it. TEST ONLY: holds the token.
package struct FakeAppleIssuedToken: Sendable, Equatable {
    package var token: String
    /// The authorization code it was issued for (nil: registered by a test).
    package var code: String?
    package var issuedAt: Date
    /// Revoked by the client or ended by the user: it no longer works at Apple.
    package var dead: Bool
    /// Revoked by a `POST /auth/revoke`.
    package var revokedByClient: Bool
}

/// An answer the fake gives instead of the real one, consumed one per call.
package enum FakeAppleFailure: Sendable, Equatable {
    /// An HTTP status with an empty JSON body (`429` gets `Retry-After` when configured).
    case status(Int)
    /// No answer until the client gives up (the fake holds the request).
    case timeout
    /// 400 with this OAuth error (`invalid_client`, `unauthorized_client`, `invalid_grant`).
    case oauthError(String)
    /// 200 with an `id_token` signed by a key Apple never published (token endpoint only).
    case badSignature
    /// The real answer (the call takes effect at once), sent only after the hang duration: a reply
    /// that arrives while the caller's database is away.
    case slow

    /// Parses `503`, `"timeout"`, `"invalid_client"`, `"bad_signature"`, `"slow"`.
    package init?(json value: Any) {
        if let number = value as? Int {
            self = .status(number)
        } else if let text = value as? String {
            switch text {
            case "timeout": self = .timeout
            case "bad_signature": self = .badSignature
            case "slow": self = .slow
            default:
                if let number = Int(text) { self = .status(number) } else { self = .oauthError(text) }
            }
        } else {
            return nil
        }
    }
}

struct FakeAppleState {
    /// Who `GET /auth/authorize` signs in without asking (tests); nil: it shows its chooser.
    var authorizeUser: FakeAppleAuthorizeUser?
    struct Code {
        var clientID: String
        var sub: String
        var email: String?
        var isPrivateEmail: Bool?
        var createdAt: Date
        /// The redirect URI of the web authorization that issued it: the exchange must send the same.
        var redirectURI: String? = nil
        var used = false
    }

    struct Token {
        var clientID: String
        var sub: String
        /// Dead at Apple: revoked by the client, or ended by the user (consent withdrawn, account deleted).
        var revoked = false
        /// Revoked by a `POST /auth/revoke` of the client.
        var revokedByClient = false
        var issuedAt = Date()
        /// The authorization code it was issued for (nil: registered by a test).
        var code: String?
        /// Revoke calls that named this token (Apple answers each with 200; tests count repeats).
        var revokeCalls = 0
    }

    struct Injected {
        var responses: [FakeAppleFailure]
        var retryAfter: String?
    }

    struct MigrationToken {
        var clientID: String
        var team: String
        var expiresAt: Date
    }

    /// A transfer identifier the sending team obtained: whose it is and for which team.
    struct Transfer {
        var clientID: String
        var fromTeam: String
        var toTeam: String
        var sub: String
    }

    var codes: [String: Code] = [:]
    var migrationTokens: [String: MigrationToken] = [:]
    var transfers: [String: Transfer] = [:]
    /// Subs Apple will not migrate (e.g. consent revoked before the transfer).
    var unmigratableSubs: Set<String> = []
    var migrationAnswers: [String: Int] = [:]
    var refreshTokens: [String: Token] = [:]
    /// Keyed by endpoint (every client) or `failureKey(endpoint, clientID)` (one client ID).
    var failures: [String: Injected] = [:]
    /// Calls to hold until the test releases them, keyed like `failures` (one client ID).
    var holds: [String: FakeAppleHeldCall] = [:]
    /// Per endpoint: after `remaining` more calls pass, every further call is parked unanswered
    /// until the gate opens (a job interrupted at a known point, whatever the machine's speed).
    var gates: [String: Gate] = [:]

    struct Gate {
        var remaining: Int
        var parked: [@Sendable () -> Void] = []
    }
    var calls: [FakeAppleCall] = []
    /// When the user ended their grants, per `grantKey`: a token registered later but dated before
    /// one of these is dead from the start.
    var grantEnds: [String: [Date]] = [:]

    static func grantKey(_ clientID: String, _ sub: String) -> String { "\(clientID) \(sub)" }

    /// Every token of `(clientID, sub)` issued before `time` (or at it, `inclusive`) stops working.
    mutating func endGrants(clientID: String, sub: String, issuedBefore time: Date, inclusive: Bool) {
        grantEnds[Self.grantKey(clientID, sub), default: []].append(inclusive ? time.addingTimeInterval(1e-6) : time)
        for (token, entry) in refreshTokens
        where entry.clientID == clientID && entry.sub == sub && (entry.issuedAt < time || (inclusive && entry.issuedAt == time)) {
            refreshTokens[token]?.revoked = true
        }
    }

    static func failureKey(_ endpoint: String, _ clientID: String?) -> String {
        clientID.map { "\(endpoint) \($0)" } ?? endpoint
    }

    /// The next injected answer for a call: the client ID's own queue first, then the endpoint's.
    mutating func nextFailure(_ endpoint: String, clientID: String?) -> (FakeAppleFailure, String?)? {
        let keys = clientID == nil ? [endpoint] : [Self.failureKey(endpoint, clientID), endpoint]
        for key in keys {
            guard var injected = failures[key], !injected.responses.isEmpty else { continue }
            let failure = injected.responses.removeFirst()
            failures[key] = injected
            return (failure, injected.retryAfter)
        }
        return nil
    }
}

/// A call the fake holds without answering until the test releases it (`FakeApple.holdNextCall`):
/// Apple answering slowly, so a test can run other work while the call is in flight.
package final class FakeAppleHeldCall: Sendable {
    private struct State {
        var arrived = false
        /// Set once the call arrived: answers it (nil = the real answer, else the injected one).
        var answer: (@Sendable (FakeAppleFailure?) -> Void)?
        var released = false
    }

    private let state = Locked(State())
    let key: String

    init(key: String) {
        self.key = key
    }

    /// Whether the held call has reached the fake.
    package var hasArrived: Bool { state.withLock { $0.arrived } }

    /// Called by the fake when the call arrives; false if the hold was already released (answer now).
    func arrive(_ answer: @escaping @Sendable (FakeAppleFailure?) -> Void) -> Bool {
        state.withLock { state in
            guard !state.released else { return false }
            state.arrived = true
            state.answer = answer
            return true
        }
    }

    /// Answers the held call (`failure` nil: the real answer). Before the call arrived, the hold is
    /// simply dropped: a later call is answered at once.
    package func release(answering failure: FakeAppleFailure? = nil) {
        let answer = state.withLock { state -> (@Sendable (FakeAppleFailure?) -> Void)? in
            state.released = true
            defer { state.answer = nil }
            return state.answer
        }
        answer?(failure)
    }
}
