package import AppleClient
package import CryptoCore
package import Foundation
import JOSE
import JSON
package import SiwaModel

/// Why a request is refused: the HTTP status and the stable error code put in the body and in
/// the `reason` label of the metrics. Never carries token content.
package struct Rejection: Error, Sendable, Equatable, CustomStringConvertible {
    package var status: Int
    package var code: String

    package init(status: Int, code: String) {
        self.status = status
        self.code = code
    }

    package var description: String { "\(status) \(code)" }

    // 400: the request is not a well-formed notification.
    package static let bodyNotJSON = Rejection(status: 400, code: "body_not_json")
    package static let payloadMissing = Rejection(status: 400, code: "payload_missing")
    package static let jwsMalformed = Rejection(status: 400, code: "jws_malformed")
    // 401: well-formed, but not from Apple for us.
    package static let algorithmNotAllowed = Rejection(status: 401, code: "alg_not_allowed")
    package static let unknownKey = Rejection(status: 401, code: "unknown_kid")
    package static let badSignature = Rejection(status: 401, code: "bad_signature")
    package static let wrongIssuer = Rejection(status: 401, code: "wrong_issuer")
    package static let wrongAudience = Rejection(status: 401, code: "wrong_audience")
    package static let expired = Rejection(status: 401, code: "expired")
    // 503: we cannot decide or store now; Apple (or whoever) may try again.
    package static let keysUnavailable = Rejection(status: 503, code: "keys_unavailable")
    package static let databaseUnavailable = Rejection(status: 503, code: "database_unavailable")
    package static let overloaded = Rejection(status: 503, code: "overloaded")
    package static let shuttingDown = Rejection(status: 503, code: "shutting_down")
    /// The commit did not finish within `SIWA_RECEIVER_COMMIT_TIMEOUT`.
    package static let databaseTimeout = Rejection(status: 503, code: "database_timeout")
    /// The database refused the row itself (SQLSTATE class 22 or 23): retrying cannot help.
    package static let claimsNotStorable = Rejection(status: 400, code: "claims_not_storable")

    package static func decoding(_ error: NotificationDecodingError) -> Rejection {
        Rejection(status: 400, code: error.code)
    }

    /// Every code, for pre-registering metric series (so hostile input cannot add series).
    package static let allCodes: [Rejection] = [
        .bodyNotJSON, .payloadMissing, .jwsMalformed, .algorithmNotAllowed, .unknownKey, .badSignature,
        .wrongIssuer, .wrongAudience, .expired, .keysUnavailable, .databaseUnavailable, .databaseTimeout, .overloaded,
        .shuttingDown, .decoding(.claimsNotJSON()), .decoding(.missingClaim("")), .decoding(.claimMalformed("")),
        .decoding(.eventsMissing()), .decoding(.eventsMalformed("")), .claimsNotStorable,
    ]
}

/// A notification whose signature and claims checked out, ready to store.
package struct VerifiedNotification: Sendable {
    package var notification: AppleNotification
    /// The `aud` that matched `SIWA_CLIENT_IDS`.
    package var clientID: String
    /// The compact JWS as received (stored for audit and replay).
    package var jws: String
    /// The JWS payload, stored as `claims jsonb`.
    package var claimsJSON: String
}

/// Turns a request body into a verified notification or a rejection, in the contract's order:
/// structure (400) → algorithm, key, signature (401) → claims (400/401).
package struct NotificationVerifier: Sendable {
    package enum Step: Sendable {
        case verified(VerifiedNotification)
        case rejected(Rejection)
        /// The key is not cached: finish with `verify(body:)` off the request thread.
        case needsKey(String)
    }

    private let clientIDs: Set<String>
    private let keys: AppleKeySet
    private let now: @Sendable () -> Date
    /// Tolerated clock difference when checking `exp`.
    private let leeway: TimeInterval

    package init(
        clientIDs: some Sequence<String>, keys: AppleKeySet, leeway: TimeInterval = 60,
        now: @escaping @Sendable () -> Date = { Date() }
    ) {
        self.clientIDs = Set(clientIDs)
        self.keys = keys
        self.leeway = leeway
        self.now = now
    }

    /// Verification without waiting: uses only cached keys.
    package func verifyCached(body: [UInt8]) -> Step {
        verify(body: body, lookup: keys.cachedKey)
    }

    /// The whole decoding path against a fixed key set, with no I/O and no waiting: body bytes →
    /// payload → compact JWS → alg pin → key → signature → claims. For fuzzing and in-process tests;
    /// a kid outside `keys` is `unknown_kid`.
    package func verify(body: [UInt8], keys: [String: RSA.PublicKey]) -> Result<VerifiedNotification, Rejection> {
        switch verify(body: body, lookup: { keys[$0] }) {
        case .verified(let verified): .success(verified)
        case .rejected(let rejection): .failure(rejection)
        case .needsKey: .failure(.unknownKey)
        }
    }

    private func verify(body: [UInt8], lookup: (String) -> RSA.PublicKey?) -> Step {
        let token: CompactJWS
        let jwsText: String
        switch Self.parse(body: body) {
        case .failure(let rejection): return .rejected(rejection)
        case .success(let parsed): (token, jwsText) = parsed
        }
        // An empty kid names no key Apple could publish: refused without a refetch.
        guard token.keyID?.isEmpty == false else {
            return .rejected(token.algorithm == RS256.algorithm ? .unknownKey : .algorithmNotAllowed)
        }
        return check(token, jws: jwsText, keys: lookup)
    }

    /// Full verification, fetching Apple's keys once if the token names a kid we have not seen.
    package func verify(body: [UInt8]) async -> Result<VerifiedNotification, Rejection> {
        switch verifyCached(body: body) {
        case .verified(let verified): return .success(verified)
        case .rejected(let rejection): return .failure(rejection)
        case .needsKey(let keyID):
            switch await keys.key(keyID) {
            case .unknownKey: return .failure(.unknownKey)
            case .unavailable: return .failure(.keysUnavailable)
            case .found(let key):
                guard case .success(let (token, jwsText)) = Self.parse(body: body) else { return .failure(.jwsMalformed) }
                switch check(token, jws: jwsText, keys: { $0 == keyID ? key : nil }) {
                case .verified(let verified): return .success(verified)
                case .rejected(let rejection): return .failure(rejection)
                case .needsKey: return .failure(.unknownKey)
                }
            }
        }
    }

    static func parse(body: [UInt8]) -> Result<(CompactJWS, String), Rejection> {
        let payload: String
        if let exact = exactPayload(body) {
            payload = exact
        } else {
            guard let object = JSONValue.object(body) else { return .failure(.bodyNotJSON) }
            guard let value = object["payload"]?.stringValue else { return .failure(.payloadMissing) }
            payload = value
        }
        // The claims are parsed once, by AppleNotification, after the signature checks out.
        guard let token = try? CompactJWS(payload, checkPayloadIsJSONObject: false) else {
            return .failure(.jwsMalformed)
        }
        return .success((token, payload))
    }

    /// The body Apple sends, `{"payload":"<JWS>"}` exactly, read without a JSON parser: every
    /// request pays for this, and the JWS alphabet (base64url and dots) needs no unescaping. Any
    /// other shape returns nil and goes through the full parser, so the result is the same.
    package static func exactPayload(_ body: [UInt8]) -> String? {
        let prefix = Array(#"{"payload":""#.utf8)
        let suffix = Array(#""}"#.utf8)
        guard body.count > prefix.count + suffix.count, body.starts(with: prefix), body.suffix(2).elementsEqual(suffix)
        else { return nil }
        let inner = body[prefix.count..<(body.count - suffix.count)]
        for byte in inner {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "_"), UInt8(ascii: "."):
                continue
            default:
                return nil
            }
        }
        return String(decoding: inner, as: UTF8.self)
    }

    /// The signature through JOSE's one RS256 path (alg pinned before any key is touched: `none`,
    /// `HS256` keyed with the RSA public key, `RS512` are refused; a `crit` header is refused),
    /// then the claims.
    private func check(_ token: CompactJWS, jws: String, keys: (String) -> RSA.PublicKey?) -> Step {
        do {
            try RS256.verify(token, keys: keys)
        } catch let error as JOSEError {
            switch error.code {
            case .unsupportedAlgorithm: return .rejected(.algorithmNotAllowed)
            case .unknownKey(let keyID?) where !keyID.isEmpty: return .needsKey(keyID)
            case .unknownKey: return .rejected(.unknownKey)
            case .badSignature: return .rejected(.badSignature)
            case .malformed: return .rejected(.jwsMalformed)
            }
        } catch {
            return .rejected(.badSignature)
        }
        let notification: AppleNotification
        do {
            notification = try AppleNotification(claims: token.payloadBytes)
        } catch {
            return .rejected(.decoding(error))
        }
        // The issuer stays Apple's whatever SIWA_APPLE_BASE_URL points at.
        guard notification.issuer == AppleNotification.appleIssuer else { return .rejected(.wrongIssuer) }
        guard let clientID = notification.audiences.first(where: clientIDs.contains) else {
            return .rejected(.wrongAudience)
        }
        if let expiresAt = notification.expiresAt, expiresAt.addingTimeInterval(leeway) < now() {
            return .rejected(.expired)
        }
        let claims = String(decoding: token.payloadBytes, as: UTF8.self)
        return .verified(VerifiedNotification(notification: notification, clientID: clientID, jws: jws, claimsJSON: claims))
    }
}
