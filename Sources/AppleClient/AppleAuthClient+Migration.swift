import Foundation

/// A user-migration access token (`scope=user.migration`). Apple's live one hour and serve many
/// calls. Secret: never logged, never stored.
package struct MigrationAccessToken: Sendable, Equatable {
    package var value: String
    /// `expires_in` as Apple sent it, when it did.
    package var lifetime: Duration?

    package init(value: String, lifetime: Duration?) {
        self.value = value
        self.lifetime = lifetime
    }
}

/// The user under the recipient team, as `usermigrationinfo` answers a `transfer_sub`.
package struct MigratedIdentity: Sendable, Equatable {
    package var sub: String
    package var email: String?
    package var isPrivateEmail: Bool?

    package init(sub: String, email: String?, isPrivateEmail: Bool?) {
        self.sub = sub
        self.email = email
        self.isPrivateEmail = isPrivateEmail
    }
}

/// Team transfer (TN3159): the migration access token and both directions of
/// `POST {base}/auth/usermigrationinfo`. Outcomes are classified as for every other call; a
/// refused bearer token is `otherClientError(status: 401, ...)` or `invalidGrant` (Apple's answer
/// for an expired access token), which callers meet by asking for a new token once.
extension AppleAuthClient {
    /// `POST {base}/auth/token` with `grant_type=client_credentials`, `scope=user.migration`.
    package func migrationAccessToken(clientID: String) async -> AppleCallOutcome<MigrationAccessToken> {
        await migrationCall("auth/token", clientID: clientID, bearer: nil,
            fields: [("grant_type", "client_credentials"), ("scope", "user.migration")]) { object in
            guard let token = object["access_token"] as? String, !token.isEmpty else { return nil }
            let seconds = (object["expires_in"] as? NSNumber)?.int64Value
            return MigrationAccessToken(value: token, lifetime: seconds.map { .seconds($0) })
        }
    }

    /// Sending team: the transfer identifier of `sub` for the recipient team `targetTeam`.
    package func transferSub(
        sub: String, targetTeam: String, clientID: String, accessToken: String
    ) async -> AppleCallOutcome<String> {
        await migrationCall("auth/usermigrationinfo", clientID: clientID, bearer: accessToken,
            fields: [("sub", sub), ("target", targetTeam)]) { object in
            guard let transferSub = object["transfer_sub"] as? String, !transferSub.isEmpty else { return nil }
            return transferSub
        }
    }

    /// Recipient team: the user's `sub`, email and `is_private_email` under this team.
    package func migratedIdentity(
        transferSub: String, clientID: String, accessToken: String
    ) async -> AppleCallOutcome<MigratedIdentity> {
        await migrationCall("auth/usermigrationinfo", clientID: clientID, bearer: accessToken,
            fields: [("transfer_sub", transferSub)]) { object in
            guard let sub = object["sub"] as? String, !sub.isEmpty else { return nil }
            let isPrivate: Bool? =
                switch object["is_private_email"] {
                case let flag as Bool: flag
                case let text as String: text == "true" ? true : (text == "false" ? false : nil)
                default: nil
                }
            let email = (object["email"] as? String).flatMap { $0.isEmpty ? nil : $0 }
            return MigratedIdentity(sub: sub, email: email, isPrivateEmail: isPrivate)
        }
    }

    private func migrationCall<Value>(
        _ path: String, clientID: String, bearer: String?, fields extra: [(String, String)],
        decode: @escaping ([String: Any]) -> Value?
    ) async -> AppleCallOutcome<Value> {
        let secret: String
        do { secret = try signer.makeSecret(clientID: clientID) } catch {
            return .configurationFault(error: "client_secret_signing_failed")
        }
        let fields = extra + [("client_id", clientID), ("client_secret", secret)]
        do {
            let response = try await http.postForm(path, fields: fields, bearer: bearer)
            return Self.classify(response) { body in
                guard let object = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any] else { return nil }
                return decode(object)
            }
        } catch {
            return Self.classify(transportError: error)
        }
    }
}
