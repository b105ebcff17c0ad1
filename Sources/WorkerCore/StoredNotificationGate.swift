import AppleClient
import Foundation
import JOSE
import JobQueue
import Logging
import Postgres
import SiwaModel
import Metrics

/// Verifies what the receiver's role stored before any of it is applied.
///
/// The receiver is the one process on the internet; its role may add notifications, so a
/// compromised receiver could store a row claiming an `account-deleted` for anyone. The job of a
/// notification a `siwa_receiver` login stored is therefore held (`run_at` infinity, set by the
/// trigger in sql/functions/jobs.sql) until a worker has checked the stored `jws` against Apple's
/// keys and every column against its claims. A genuine one is applied in the same transaction
/// (siwa.run_notification_batch's `p_verified`), so it is written once and a rollback leaves it
/// held; one that fails is recorded as `forged` on the notification and its job, never applied,
/// logged at `error` and counted. Rows written by other roles (the schema owner, operators) are
/// not held.
struct StoredNotificationGate: Sendable {
    /// What the gate made of the held jobs it read in a batch's transaction.
    struct HeldVerdicts: Sendable, Equatable {
        /// Verified and still locked: the batch applies them before any due job.
        var genuine: [Int64] = []
        /// Recorded as forged in the transaction; reported (logged, counted) only once it commits.
        var forged: [Forged] = []

        struct Forged: Sendable, Equatable {
            var jobID: Int64
            var jti: String
            var reason: String
        }
    }

    let keys: AppleKeySet
    let logger: Logger
    let forged: Counter

    private struct Held {
        var jobID: Int64
        var jti: String
        var clientID: String
        var sub: String
        var eventType: String
        var eventMilliseconds: Int64
        var email: String?
        var isPrivateEmail: Bool?
        var jws: String?
    }

    /// Judges the held jobs the caller's transaction read and locked (`JobQueue.heldNotificationsQuery`,
    /// SKIP LOCKED, so workers share the work) and returns the genuine ones, still locked, for the
    /// caller to apply before it commits; forged ones are recorded in the same transaction, and
    /// reported by `report(_:)` once it has committed (a batch that rolls back and runs again
    /// judges them again). The read travels with the batch's BEGIN; with nothing held it costs one
    /// empty range of the claim index (priority 2, run_at infinity). Jobs whose key cannot be had
    /// now (Apple unreachable) stay held for the next pass.
    func verifyHeld(_ rows: PostgresRows, on connection: PostgresConnection) async throws -> HeldVerdicts {
        var verdicts = HeldVerdicts()
        for row in rows {
            let held = Held(
                jobID: try row.decode(Int64.self, column: "id"), jti: try row.decode(String.self, column: "jti"),
                clientID: try row.decode(String.self, column: "client_id"),
                sub: try row.decode(String.self, column: "sub"),
                eventType: try row.decode(String.self, column: "event_type"),
                eventMilliseconds: try row.decode(Int64.self, column: "event_ms"),
                email: try row.decode(String?.self, column: "email"),
                isPrivateEmail: try row.decode(Bool?.self, column: "is_private_email"),
                jws: try row.decode(String?.self, column: "jws"))
            switch await judge(held) {
            case .genuine: verdicts.genuine.append(held.jobID)
            case .forged(let reason): verdicts.forged.append(.init(jobID: held.jobID, jti: held.jti, reason: reason))
            case .undecided: continue
            }
        }
        if !verdicts.forged.isEmpty {
            try await JobQueue.completeForgedNotifications(verdicts.forged.map(\.jobID), on: connection)
        }
        return verdicts
    }

    /// Logs and counts the forged notifications of a committed batch.
    func report(_ verdicts: HeldVerdicts) {
        guard !verdicts.forged.isEmpty else { return }
        for item in verdicts.forged {
            logger.error(
                "stored notification does not verify against Apple's keys or its claims: recorded as forged, not applied",
                metadata: ["jti": .string(item.jti), "job_id": .int(Int(item.jobID)), "reason": .string(item.reason)])
        }
        forged.increment(by: verdicts.forged.count)
    }

    private enum Verdict {
        case genuine
        case forged(String)
        /// Apple's keys cannot be had now: judge again later.
        case undecided
    }

    /// The receiver's checks again (signature by one of Apple's keys, RS256 pinned, `iss`), then
    /// every stored column against the signed claims. `exp` is not checked: a genuine notification
    /// may wait in the queue past it.
    private func judge(_ held: Held) async -> Verdict {
        guard let jws = held.jws, let token = try? CompactJWS(jws, checkPayloadIsJSONObject: false) else {
            return .forged("jws_malformed")
        }
        guard token.algorithm == RS256.algorithm, let keyID = token.keyID, !keyID.isEmpty else {
            return .forged("alg_or_kid")
        }
        let key: RS256.PublicKey
        if let cached = keys.cachedKey(keyID) {
            key = cached
        } else {
            switch await keys.key(keyID) {
            case .found(let found): key = found
            case .unknownKey: return .forged("unknown_kid")
            case .unavailable: return .undecided
            }
        }
        do { try RS256.verify(token, publicKey: key) } catch { return .forged("bad_signature") }
        guard let claims = try? AppleNotification(claims: token.payloadBytes) else { return .forged("claims_malformed") }
        let event = claims.event
        let agrees =
            claims.issuer == AppleNotification.appleIssuer && claims.jti == held.jti
            && claims.audiences.contains(held.clientID) && event.sub == held.sub
            && event.type.rawValue == held.eventType
            && Int64((event.time.timeIntervalSince1970 * 1000).rounded()) == held.eventMilliseconds
            && event.email == held.email && event.isPrivateEmail == held.isPrivateEmail
        return agrees ? .genuine : .forged("columns_disagree_with_claims")
    }
}
