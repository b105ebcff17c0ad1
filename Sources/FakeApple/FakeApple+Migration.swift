package import AppleClient
import CryptoCore
import Foundation
import Locking
import HTTPServer

/// Team transfer (TN3159), deterministically: the same `(team, target, client_id, sub)` always gets
/// the same `transfer_sub`, and a user's `sub` under the recipient team is derived from the sending
/// team's `sub` and the recipient team, so tests can compute what to expect.
///
/// What the fake checks, as Apple does: the client_secret (its `iss` names the calling team), the
/// bearer access token (obtained with `client_credentials`/`user.migration` by the same team for the
/// same client ID, unexpired), `target` (a configured team other than the caller's), and that a
/// `transfer_sub` is exchanged only by the team it was made for, for the same client ID.
extension FakeApple {
    /// `grant_type=client_credentials`: a migration access token for `team`.
    func migrationToken(_ form: [String: String], clientID: String, team: String) -> HTTPResponse {
        guard form["scope"] == "user.migration" else { return Self.oauthError("invalid_scope") }
        let token = "m" + Self.randomHex(16)
        let lifetime = configuration.migrationTokenLifetime
        state.withLock {
            $0.migrationTokens[token] = .init(clientID: clientID, team: team, expiresAt: Date().addingTimeInterval(lifetime))
        }
        return Self.json(["access_token": token, "token_type": "Bearer", "expires_in": Int(lifetime)])
    }

    /// `POST /auth/usermigrationinfo`: `sub` + `target` (sending team) or `transfer_sub` (recipient).
    func userMigrationInfo(_ form: [String: String], authorization: String?) -> (HTTPResponse, Bool) {
        guard let clientID = form["client_id"], !clientID.isEmpty, let secret = form["client_secret"], !secret.isEmpty
        else { return (Self.oauthError("invalid_request"), false) }
        guard let team = clientSecretTeam(secret, clientID: clientID) else { return (Self.oauthError("invalid_client"), false) }
        guard let authorization, authorization.hasPrefix("Bearer "),
            state.withLock({ state in
                guard let token = state.migrationTokens[String(authorization.dropFirst("Bearer ".count))] else { return false }
                return token.clientID == clientID && token.team == team && token.expiresAt > Date()
            })
        else { return (Self.oauthError("invalid_token", status: 401), true) }

        if let sub = form["sub"], !sub.isEmpty {
            guard let target = form["target"], !target.isEmpty, target != team,
                configuration.teams.isEmpty || configuration.teams.contains(where: { $0.id == target })
            else { return (Self.oauthError("invalid_request"), true) }
            let transferSub = Self.transferSub(sub: sub, clientID: clientID, fromTeam: team, toTeam: target)
            let refused = state.withLock { state -> Bool in
                guard !state.unmigratableSubs.contains(sub) else { return true }
                state.transfers[transferSub] = .init(clientID: clientID, fromTeam: team, toTeam: target, sub: sub)
                state.migrationAnswers[sub, default: 0] += 1
                return false
            }
            guard !refused else { return (Self.oauthError("invalid_request"), true) }
            return (Self.json(["transfer_sub": transferSub]), true)
        }
        guard let transferSub = form["transfer_sub"], !transferSub.isEmpty,
            let transfer = state.withLock({ $0.transfers[transferSub] })
        else { return (Self.oauthError("invalid_request"), true) }
        guard transfer.toTeam == team, transfer.clientID == clientID else { return (Self.oauthError("invalid_grant"), true) }
        state.withLock { $0.migrationAnswers[transferSub, default: 0] += 1 }
        let identity = Self.migratedIdentity(of: transfer.sub, fromTeam: transfer.fromTeam, toTeam: team)
        var answer: [String: Any] = ["sub": identity.sub]
        if let email = identity.email { answer["email"] = email }
        if let isPrivate = identity.isPrivateEmail { answer["is_private_email"] = isPrivate }
        return (Self.json(answer), true)
    }

    // MARK: Deterministic identifiers

    /// The `transfer_sub` the sending team gets for `sub`.
    package static func transferSub(sub: String, clientID: String, fromTeam: String, toTeam: String) -> String {
        let digest = hexDigest("transfer|\(fromTeam)|\(toTeam)|\(clientID)|\(sub)")
        return "\(digest.prefix(6)).\(digest.dropFirst(6).prefix(32)).t\(digest.suffix(3))"
    }

    /// The user of `sub` (a sending-team identifier) as the recipient team sees them. Every tenth user
    /// (by the digest) shared a real address; the others a private relay address, new per team.
    package static func migratedIdentity(of sub: String, fromTeam: String, toTeam: String) -> MigratedIdentity {
        let digest = hexDigest("user|\(fromTeam)|\(toTeam)|\(sub)")
        let newSub = "\(digest.prefix(6)).\(digest.dropFirst(6).prefix(32)).\(digest.suffix(4))"
        if digest.hasPrefix("0") || digest.hasPrefix("1") {
            return MigratedIdentity(sub: newSub, email: "user-\(digest.suffix(8))@example.com", isPrivateEmail: false)
        }
        return MigratedIdentity(sub: newSub, email: "\(digest.dropFirst(8).prefix(10))@privaterelay.appleid.com", isPrivateEmail: true)
    }

    private static func hexDigest(_ text: String) -> String {
        SHA256.hash(Array(text.utf8)).map { String(format: "%02x", $0) }.joined()
    }

    // MARK: Test API

    /// Apple will refuse to migrate `sub` (e.g. the user revoked consent before the transfer).
    package func refuseMigration(sub: String) {
        state.withLock { _ = $0.unmigratableSubs.insert(sub) }
    }

    /// Ends every migration access token now (Apple's last one hour).
    package func expireMigrationTokens() {
        state.withLock { state in
            for key in state.migrationTokens.keys { state.migrationTokens[key]?.expiresAt = .distantPast }
        }
    }

    /// How many times `usermigrationinfo` answered 200 for each `sub` (sending side) and each
    /// `transfer_sub` (recipient side): tests check that a resumed run does not ask again.
    package var migrationAnswers: [String: Int] { state.withLock { $0.migrationAnswers } }
}
