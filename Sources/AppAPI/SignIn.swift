import Accounts
import AppleClient
import CryptoCore
import Foundation
import Logging
import Postgres
import StoredTokens
import SiwaModel

/// `POST /v1/sign-in`: the server's half of a sign-in, checked in the contract's order. Each step either
/// answers with its error or hands on to the next:
///   1. the nonce is spent (one DELETE ... RETURNING), whatever happens after;
///   2. the identity token: RS256 with Apple's keys, `iss`, `aud` = `client_id` ∈ SIWA_CLIENT_IDS,
///      `exp`, and its `nonce` claim = hex SHA-256 of the raw nonce;
///   3. a pending deletion refuses the sign-in (403);
///   4. with a code, the code is exchanged now (codes live 5 minutes), with the web flow's redirect
///      URI when given; nothing is written before the exchange has succeeded, so a failed exchange
///      creates no account;
///   then the account effect, one call to `siwa.sign_in`.
/// No identity token, nonce, code or refresh token reaches a log or an error.
struct SignIn: Sendable {
    /// Largest identity token accepted (Apple's are about 1 KB).
    static let maximumTokenBytes = 8 * 1024
    /// Largest raw nonce accepted (ours are 43 characters).
    static let maximumNonceBytes = 512

    struct Request: Sendable {
        var clientID: String
        var identityToken: String
        var nonce: String
        var authorizationCode: String?
        /// The redirect URI of a web authorization, sent on the code exchange.
        var redirectURI: String?
        /// The name the client was given on the first authorization; nil: keep the stored one.
        var fullName: [String: String]?

        /// The body as `AppAPIEndpoints.signIn` declares it, already checked against it.
        init(_ input: AppAPIInput) {
            clientID = input.string("client_id") ?? ""
            identityToken = input.string("identity_token") ?? ""
            nonce = input.string("nonce") ?? ""
            authorizationCode = input.string("authorization_code", emptyIsAbsent: true)
            redirectURI = input.string("redirect_uri", emptyIsAbsent: true)
            fullName = input.stringMembers("full_name")
        }
    }

    let store: AppAPIStore
    let verifier: IdentityTokenVerifier
    /// The exchange handler's client (same signer, same code), over an HTTP session bounded at 5 s.
    let client: AppleAuthClient
    let tokenBox: TokenBox
    let clientIDs: Set<String>
    let metrics: AppAPIMetrics
    let logger: Logger

    func run(_ request: Request) async -> Result<[String: Any], AppAPIError> {
        // 1. The nonce. The statement that spends it also reads the account the token names, so
        // step 3 costs no second round trip; that state is used only if step 2 proves that `sub`.
        let nonceHash = SHA256.hash(Array(request.nonce.utf8))
        let token = ParsedIdentityToken(request.identityToken)
        let claimedSub = token.flatMap(Self.claimedSub)
        var readAhead: (sub: String, state: AppAPIStore.SignInState)?
        do {
            let spent: Bool
            if let claimedSub {
                let result = try await store.consumeNonce(hash: nonceHash, readingStateOf: request.clientID, sub: claimedSub)
                (spent, readAhead) = (result.spent, (claimedSub, result.state))
            } else {
                spent = try await store.consumeNonce(hash: nonceHash)
            }
            guard spent else { return .failure(.nonceInvalid) }
        } catch {
            logger.warning("sign-in: could not consume the nonce", metadata: ["error": "\(error)"])
            return .failure(.database(error))
        }

        // 2. The identity token.
        guard clientIDs.contains(request.clientID) else { return .failure(.tokenInvalid) }
        let identity: AppleIdentity
        do {
            identity = try await verifier.verify(token, clientID: request.clientID, rawNonce: request.nonce)
        } catch .keysUnavailable {
            return .failure(.keysUnavailable)
        } catch {
            logger.debug("sign-in: identity token refused", metadata: ["client_id": .string(request.clientID), "reason": .string(error.rawValue)])
            return .failure(.tokenInvalid)
        }

        // A user moved from another team (TN3159): the imported line's account, before anything else.
        var transferred = false
        if let transferSub = identity.transferSub {
            do {
                transferred =
                    try await store.claimTransfer(
                        clientID: request.clientID, transferSub: transferSub, sub: identity.sub, email: identity.email,
                        isPrivateEmail: identity.isPrivateEmail) != nil
            } catch {
                logger.warning("sign-in: could not claim a team transfer", metadata: ["error": "\(error)"])
                return .failure(.database(error))
            }
        }

        // 3. The account's state: as read with the nonce, unless a transfer claim has just written
        // the account (or the verified `sub` is not the one read).
        let state: AppAPIStore.SignInState
        do {
            if let readAhead, readAhead.sub == identity.sub, identity.transferSub == nil {
                state = readAhead.state
            } else {
                state = try await store.signInState(clientID: request.clientID, sub: identity.sub)
            }
        } catch {
            logger.warning("sign-in: could not read the account", metadata: ["error": "\(error)"])
            return .failure(.database(error))
        }
        if state.status == .pendingDeletion { return .failure(.accountDeleting) }

        // 4. The exchange, before anything is written; also when a token is held: the code is the
        // user's grant as of now (the held token may be one Apple has ended since, its
        // notification still on its way), and the new token becomes current.
        var refreshToken: String?
        if let code = request.authorizationCode {
            switch await exchange(code: code, clientID: request.clientID, sub: identity.sub, redirectURI: request.redirectURI) {
            case .success(let token): refreshToken = token
            case .failure(let error): return .failure(error)
            }
        }

        // The account effect.
        do {
            let sealed = try refreshToken.map { try tokenBox.seal($0, clientID: request.clientID, sub: identity.sub) }
            let (account, isNew) = try await store.signIn(
                clientID: request.clientID, sub: identity.sub, email: identity.email,
                isPrivateEmail: identity.isPrivateEmail, sealedToken: sealed,
                deletionRequestsSeen: state.deletionRequests, fullName: request.fullName,
                realUserStatus: identity.realUserStatus)
            // A deletion requested while Apple was asked: it stands, and holds the token to revoke it.
            guard account.status == .active else { return .failure(.accountDeleting) }
            return .success([
                "client_id": account.clientID, "sub": account.sub, "email": AppAPIJSON.value(account.email),
                "email_verified": AppAPIJSON.value(identity.emailVerified),
                "is_private_email": AppAPIJSON.value(account.isPrivateEmail), "status": account.status.rawValue,
                "app_user_id": AppAPIJSON.value(account.appUserID), "new": isNew && !transferred,
                "has_refresh_token": account.hasRefreshToken, "full_name": AppAPIJSON.value(account.fullName),
                "real_user_status": AppAPIJSON.value(account.realUserStatus),
            ])
        } catch {
            logger.warning("sign-in: could not record the sign-in", metadata: ["error": "\(error)"])
            await revokeUnkept(refreshToken, clientID: request.clientID, sub: identity.sub, reason: "sign_in_not_recorded")
            return .failure(.database(error))
        }
    }

    /// The `sub` an identity token claims, read without verifying it: only to read its account
    /// ahead. Nil when the token does not parse (its verification fails then anyway).
    static func claimedSub(_ identityToken: ParsedIdentityToken) -> String? {
        guard let sub = identityToken.claimedSub, !sub.isEmpty,
            !sub.unicodeScalars.contains("\u{0}")  // no account has it, and the database cannot compare it
        else { return nil }
        return sub
    }

    /// Exchanges `code`; the refresh token on success (its `id_token` verified and about `sub`).
    private func exchange(code: String, clientID: String, sub: String, redirectURI: String?) async -> Result<String, AppAPIError> {
        let outcome = await client.exchange(code: code, clientID: clientID, redirectURI: redirectURI)
        switch outcome {
        case .success(let response):
            guard let refreshToken = response.refreshToken, !refreshToken.isEmpty, let idToken = response.idToken,
                !idToken.isEmpty
            else {
                metrics.exchangeFailed("incomplete_response")
                await revokeUnkept(response.refreshToken, clientID: clientID, sub: sub, reason: "incomplete_response")
                return .failure(.tokenExchangeFailed)
            }
            do {
                _ = try await verifier.verify(idToken, clientID: clientID, expectedSub: sub)
                return .success(refreshToken)
            } catch {
                // Never kept, so revoked: a grant for another user (or an unverifiable one) stays closed.
                metrics.exchangeFailed(error == .subMismatch ? "sub_mismatch" : "id_token_invalid")
                logger.warning("sign-in: the exchange's id_token was refused", metadata: ["client_id": .string(clientID), "reason": .string(error.rawValue)])
                await revokeUnkept(refreshToken, clientID: clientID, sub: sub, reason: "id_token_refused")
                return .failure(error == .keysUnavailable ? .tokenExchangeFailed : .codeInvalid)
            }
        case .invalidGrant:
            metrics.exchangeFailed("invalid_grant")
            return .failure(.codeInvalid)
        case .configurationFault(let error):
            metrics.exchangeFailed("configuration")
            logger.error(
                "sign-in: Apple rejected the client credentials. Check SIWA_TEAM_ID, SIWA_KEY_ID, SIWA_PRIVATE_KEY_FILE and the client ID",
                metadata: ["client_id": .string(clientID), "apple.error": .string(error)])
            return .failure(.tokenExchangeFailed)
        case .otherClientError(let status, let error):
            metrics.exchangeFailed("apple_\(status)")
            logger.warning("sign-in: Apple refused the exchange", metadata: ["http.status": .int(status), "apple.error": .string(error ?? "")])
            return .failure(.tokenExchangeFailed)
        case .retryable(let reason):
            metrics.exchangeFailed("unavailable")
            logger.warning("sign-in: Apple's token endpoint failed", metadata: ["client_id": .string(clientID), "apple.reason": .string(reason)])
            return .failure(.tokenExchangeFailed)
        case .rateLimited:
            metrics.exchangeFailed("rate_limited")
            return .failure(.tokenExchangeFailed)
        }
    }

    /// A token this sign-in obtained but will not store: never dropped. It goes to a revoke job
    /// (`siwa.revoke_token_later`), retried like any revoke until Apple answers 200, before the
    /// sign-in answers. Only when the database cannot take the job (a fault, which may be why the
    /// sign-in failed) is it revoked here, once, bounded by the client's 5 s; both failing is logged.
    private func revokeUnkept(_ refreshToken: String?, clientID: String, sub: String, reason: String) async {
        guard let refreshToken, !refreshToken.isEmpty else { return }
        var queueError: (any Error)?
        do {
            let sealed = try tokenBox.seal(refreshToken, clientID: clientID, sub: sub)
            // A fault that just failed the sign-in may be brief: three tries, 200 ms apart.
            for attempt in 1...3 {
                do {
                    _ = try await store.revokeLater(clientID: clientID, sub: sub, sealed: sealed, reason: reason)
                    metrics.unkeptTokenQueued()
                    return
                } catch {
                    queueError = error
                    if attempt < 3 { try? await Task.sleep(for: .milliseconds(200)) }
                }
            }
        } catch {
            queueError = error
        }
        logger.warning(
            "sign-in: could not queue the revoke of a refresh token it did not keep; revoking it now",
            metadata: ["client_id": .string(clientID), "reason": .string(reason), "error": "\(queueError.map { "\($0)" } ?? "")"])
        if case .success = await client.revoke(refreshToken: refreshToken, clientID: clientID) { return }
        logger.error("sign-in: could not revoke a refresh token it did not keep", metadata: ["client_id": .string(clientID), "reason": .string(reason)])
    }
}
