package import Foundation

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

    /// Parses `503`, `"timeout"`, `"invalid_client"`, `"bad_signature"`.
    package init?(json value: Any) {
        if let number = value as? Int {
            self = .status(number)
        } else if let text = value as? String {
            switch text {
            case "timeout": self = .timeout
            case "bad_signature": self = .badSignature
            default:
                if let number = Int(text) { self = .status(number) } else { self = .oauthError(text) }
            }
        } else {
            return nil
        }
    }
}

struct FakeAppleState {
    struct Code {
        var clientID: String
        var sub: String
        var email: String?
        var isPrivateEmail: Bool?
        var createdAt: Date
        var used = false
    }

    struct Token {
        var clientID: String
        var sub: String
        var revoked = false
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
    var failures: [String: Injected] = [:]
    var calls: [FakeAppleCall] = []

    mutating func nextFailure(_ endpoint: String) -> (FakeAppleFailure, String?)? {
        guard var injected = failures[endpoint], !injected.responses.isEmpty else { return nil }
        let failure = injected.responses.removeFirst()
        failures[endpoint] = injected
        return (failure, injected.retryAfter)
    }
}
