import AppleClient
import Foundation
package import JobQueue
package import Logging
import Postgres
import SiwaModel
import Metrics
import StoredTokens

/// Exchanges the authorization code queued by `siwa.link_account` (or by `siwa.request_deletion`
/// with a code) at once (codes live five minutes, single use), verifies the returned `id_token`,
/// and hands the sealed refresh token to `siwa.exchange_succeeded`, which decides what the account
/// becomes (sql/functions/accounts.sql): this handler only talks to Apple.
///
/// A failed link (invalid_grant, a bad id_token, a sub mismatch, an expired code) goes to
/// `siwa.exchange_failed`: no token, the code removed from the job, `link_failed` recorded.
/// A token Apple issued is never dropped by a local fault: Apple's keys unreachable (the id_token
/// came straight from Apple, its claims are still checked), a database error (the commit is
/// retried), a lost lease (`siwa.exchange_succeeded` is not fenced: the code is spent, this is the
/// link's only token). A token that truly cannot be stored is revoked at Apple.
package struct ExchangeJobHandler: JobHandler {
    package let kind = JobKind.exchange
    let context: AppleJobContext
    /// Attempts at storing an obtained token before giving up and revoking it.
    var storeAttempts = 5

    package init(context: AppleJobContext) {
        self.context = context
    }

    package func run(_ job: Job, logger parent: Logger) async -> JobResult {
        let logger = parent.with(job.idMetadata)
        guard let code = job.arguments["code"] as? String, !code.isEmpty else {
            return .discarded(error: "code_missing")
        }
        if Date().timeIntervalSince(job.createdAt) > context.codeLifetime {
            return await exchangeFailed(job, reason: "code_expired", logger: logger)
        }
        do {
            if case .paused(let wait) = try await context.pauseCheck(clientID: job.clientID) {
                return .snoozed(reason: "client_paused", for: wait)
            }
        } catch {
            return .databaseFailure(error, operation: "pause_check", logger: logger)
        }

        let outcome = await context.client.exchange(code: code, clientID: job.clientID)
        switch outcome {
        case .success(let response):
            await context.resume(clientID: job.clientID, logger: logger)
            guard let refreshToken = response.refreshToken, !refreshToken.isEmpty else {
                return await exchangeFailed(job, reason: "token_response_incomplete", logger: logger)
            }
            return await obtained(refreshToken, idToken: response.idToken, job: job, logger: logger)
        case .invalidGrant:
            return await exchangeFailed(job, reason: "invalid_grant", logger: logger)
        case .otherClientError(let status, let error):
            return await exchangeFailed(job, reason: "apple_\(status)_\(error ?? "error")", logger: logger)
        case .configurationFault(let error):
            return await context.pause(clientID: job.clientID, error: error, job: job, logger: logger)
        case .retryable, .rateLimited:
            if job.errorCount + 1 >= job.maxAttempts {
                return await exchangeFailed(job, reason: "exchange_retries_exhausted", logger: logger)
            }
            return context.retry(outcome, job: job, logger: logger) ?? .failed(error: "unexpected")
        }
    }

    /// Apple issued `refreshToken`: check the identity it came with and store it, or revoke it.
    private func obtained(_ refreshToken: String, idToken: String?, job: Job, logger: Logger) async -> JobResult {
        let identity: AppleIdentity
        do throws(IdentityTokenError) {
            guard let idToken, !idToken.isEmpty else { throw IdentityTokenError.malformed }
            identity = try await context.identityVerifier.verify(
                idToken, clientID: job.clientID, expectedSub: job.sub, trustingTransportWhenKeysUnavailable: true)
        } catch {
            // Not the user the app named, or not Apple's answer: nothing of it is ours to keep or
            // to revoke (revoking would end the real user's grant).
            return await exchangeFailed(job, reason: error.rawValue, logger: logger)
        }
        let sealed: [UInt8]
        do {
            sealed = try context.tokenBox.seal(refreshToken, clientID: job.clientID, sub: job.sub)
        } catch {
            // Never keep an unencrypted token: revoke it, and the link has failed.
            logger.error("could not encrypt the refresh token", metadata: ["error": "\(error)"])
            await revokeUnstored(refreshToken, job: job, logger: logger)
            return await exchangeFailed(job, reason: "token_encryption_failed", logger: logger)
        }
        var lastError = ""
        var lastSQLState = "none"
        for attempt in 1...storeAttempts {
            do {
                let status = try await context.pool.withConnection { connection in
                    try await connection.query(
                        """
                        SELECT siwa.exchange_succeeded(\(job.id), \(sealed), \(identity.email), \(identity.isPrivateEmail))
                        """)[0].decode(AccountStatus.self, at: 0)
                }
                if status == .active {
                    context.metrics?.linked.increment()
                    logger.info("account linked")
                } else {
                    logger.info("token kept for the account's deletion", metadata: ["account.status": .string(status.rawValue)])
                }
                return .completedByHandler
            } catch {
                lastError = "\(error)"
                lastSQLState = (error as? PostgresError)?.sqlState ?? "none"
                logger.warning(
                    "could not store the refresh token; retrying",
                    metadata: ["attempt": .int(attempt), "error": .string(lastError)])
                if attempt < storeAttempts { try? await Task.sleep(for: .milliseconds(200 << attempt)) }
            }
        }
        logger.error("could not store the refresh token; revoking it at Apple", metadata: ["error": .string(lastError)])
        await revokeUnstored(refreshToken, job: job, logger: logger)
        return .failed(error: "database_error: exchange_succeeded (SQLSTATE \(lastSQLState))")
    }

    /// A token we will not store goes back to Apple, so no grant outlives our knowledge of it.
    private func revokeUnstored(_ refreshToken: String, job: Job, logger: Logger) async {
        let outcome = await context.client.revoke(refreshToken: refreshToken, clientID: job.clientID)
        switch outcome {
        case .success, .invalidGrant: logger.notice("unstored refresh token revoked at Apple")
        default: logger.error("could not revoke an unstored refresh token at Apple", metadata: ["apple.outcome": "\(outcome)"])
        }
    }

    /// Ends the exchange: code removed, `link_failed` recorded (for a link), job completed; account untouched.
    func exchangeFailed(_ job: Job, reason: String, logger: Logger) async -> JobResult {
        do {
            let completed = try await context.pool.withConnection { connection in
                try await connection.query("SELECT siwa.exchange_failed(\(job.id), \(job.attempt)::integer, \(reason))")[0]
                    .decode(Bool.self, at: 0)
            }
            if completed {
                context.metrics?.linkFailed.increment()
                logger.warning("account link failed", metadata: ["link.reason": .string(reason)])
            } else {
                logger.warning("job lease lost before completion; nothing written")
            }
            return .completedByHandler
        } catch {
            return .databaseFailure(error, operation: "exchange_failed", logger: logger)
        }
    }
}
