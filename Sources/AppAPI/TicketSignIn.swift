import CryptoCore
import Foundation
import Logging
import Postgres

/// `POST /v1/sign-in {"ticket"}`: the end of a web or Android sign-in the receiver served
/// (deploy/web-sign-in.md). The ticket is spent (one DELETE ... RETURNING
/// of `siwa.redeem_web_sign_in_ticket`, whatever happens after), and what Apple posted to the
/// receiver's callback becomes an ordinary sign-in: the identity token, the state's raw nonce (made a
/// live nonce when the ticket was stored), the code, the redirect URI the authorization used and the
/// name from `user`, handed to `SignIn.run`, so every check and effect is the native flow's.
/// An unknown, expired or spent ticket: 401 `ticket_invalid`. No ticket reaches a log.
struct TicketSignIn: Sendable {
    /// Longest ticket accepted (ours are 43 characters).
    static let maximumTicketLength = 512

    let store: AppAPIStore
    let signIn: SignIn
    let logger: Logger

    func run(ticket: String) async -> Result<[String: Any], AppAPIError> {
        let redeemed: SignIn.Request?
        do {
            redeemed = try await store.redeemTicket(hash: SHA256.hash(Array(ticket.utf8)))
        } catch {
            logger.warning("sign-in: could not redeem a ticket", metadata: ["error": "\(error)"])
            return .failure(.database(error))
        }
        guard let redeemed else { return .failure(.ticketInvalid) }
        return await signIn.run(redeemed)
    }
}

extension SignIn.Request {
    init(
        clientID: String, identityToken: String, nonce: String, authorizationCode: String?, redirectURI: String?,
        fullName: [String: String]?
    ) {
        self.clientID = clientID
        self.identityToken = identityToken
        self.nonce = nonce
        self.authorizationCode = authorizationCode
        self.redirectURI = redirectURI
        self.fullName = fullName
    }
}

extension AppAPIStore {
    /// Spends the ticket with this SHA-256: the sign-in it stands for, or nil when it is unknown,
    /// expired or spent.
    func redeemTicket(hash: [UInt8]) async throws -> SignIn.Request? {
        try await run { connection in
            guard
                let row = try await connection.query(
                    """
                    SELECT client_id, identity_token, nonce, authorization_code, redirect_uri, full_name::text AS full_name
                      FROM siwa.redeem_web_sign_in_ticket(\(hash))
                    """
                ).first
            else { return nil }
            var fullName: [String: String]?
            if let text = try row.decode(String?.self, column: "full_name"),
                let object = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: String], !object.isEmpty
            {
                fullName = object
            }
            return SignIn.Request(
                clientID: try row.decode(String.self, column: "client_id"),
                identityToken: try row.decode(String.self, column: "identity_token"),
                nonce: try row.decode(String.self, column: "nonce"),
                authorizationCode: try row.decode(String?.self, column: "authorization_code"),
                redirectURI: try row.decode(String.self, column: "redirect_uri"), fullName: fullName)
        }
    }

    /// Deletes expired web sign-in states and tickets (at most `limit` of each); returns how many.
    package func pruneWebSignIns(limit: Int = 10_000) async throws -> Int {
        try await run { connection in
            try await connection.query("SELECT siwa.prune_web_sign_ins(\(Int32(clamping: limit)))")[0].decode(Int.self, at: 0)
        }
    }
}
