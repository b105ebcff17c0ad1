import AppleClient
import Foundation
package import JobQueue
package import Logging
import Postgres
import SiwaCore

/// Exchanges the authorization code queued by `siwa.link_account` at once (codes live five minutes,
/// single use), verifies the returned `id_token`, stores the refresh token encrypted and marks the
/// account active, all in one transaction with the job's completion.
///
/// A failed link (invalid_grant, a bad id_token, a sub mismatch, an expired code) leaves no token
/// and no active status, removes the code from the job and records `link_failed` with a reason.
package struct ExchangeJobHandler: JobHandler {
    package let kind = JobKind.exchange
    let context: AppleJobContext

    package init(context: AppleJobContext) {
        self.context = context
    }

    package func run(_ job: Job, logger parent: Logger) async -> JobResult {
        let logger = parent.with(job.idMetadata)
        let arguments = job.arguments
        guard let code = arguments["code"] as? String, !code.isEmpty else {
            return .discarded(error: "code_missing")
        }
        let appUserID = arguments["app_user_id"] as? String
        if Date().timeIntervalSince(job.createdAt) > context.codeLifetime {
            return await linkFailed(job, reason: "code_expired", logger: logger)
        }
        do {
            if case .paused(let wait) = try await context.pauseCheck(clientID: job.clientID) {
                return .snoozed(reason: "client_paused", for: wait)
            }
        } catch {
            return .failed(error: "database_error")
        }

        let outcome = await context.client.exchange(code: code, clientID: job.clientID)
        switch outcome {
        case .success(let response):
            await context.resume(clientID: job.clientID, logger: logger)
            guard let refreshToken = response.refreshToken, !refreshToken.isEmpty,
                let idToken = response.idToken, !idToken.isEmpty
            else { return await linkFailed(job, reason: "token_response_incomplete", logger: logger) }
            let identity: AppleIdentity
            do {
                identity = try await context.identityVerifier.verify(idToken, clientID: job.clientID, expectedSub: job.sub)
            } catch {
                return await linkFailed(job, reason: error.rawValue, logger: logger)
            }
            let sealed: [UInt8]
            do {
                sealed = try context.tokenBox.seal(refreshToken, clientID: job.clientID, sub: job.sub)
            } catch {
                // The code is spent: nothing to retry. Never keep an unencrypted token.
                logger.error("could not encrypt the refresh token", metadata: ["error": "\(error)"])
                return await linkFailed(job, reason: "token_encryption_failed", logger: logger)
            }
            let result = await context.commitWithCompletion(job, outcome: "linked", logger: logger) { connection in
                _ = try await connection.execute(
                    """
                    INSERT INTO siwa.accounts (client_id, sub, app_user_id, status, email, is_private_email,
                                               refresh_token_enc, linked_at, token_checked_at, updated_at)
                    VALUES (\(job.clientID), \(job.sub), \(appUserID), 'active', \(identity.email), \(identity.isPrivateEmail),
                            \(sealed), now(), now(), now())
                    ON CONFLICT (client_id, sub) DO UPDATE
                       SET app_user_id = coalesce(EXCLUDED.app_user_id, accounts.app_user_id),
                           status = 'active',
                           email = coalesce(EXCLUDED.email, accounts.email),
                           is_private_email = coalesce(EXCLUDED.is_private_email, accounts.is_private_email),
                           refresh_token_enc = EXCLUDED.refresh_token_enc,
                           linked_at = now(), token_checked_at = now(), updated_at = now()
                    """)
                _ = try await connection.execute("UPDATE siwa.jobs SET args = args - 'code' WHERE id = \(job.id)")
                _ = try await connection.query(
                    "SELECT siwa.record_change(\(job.clientID), \(job.sub), 'linked', NULL, NULL, \(job.id))")
            }
            if result == .completedByHandler {
                context.metrics?.linked.increment()
                logger.info("account linked")
            }
            return result
        case .invalidGrant:
            return await linkFailed(job, reason: "invalid_grant", logger: logger)
        case .otherClientError(let status, let error):
            return await linkFailed(job, reason: "apple_\(status)_\(error ?? "error")", logger: logger)
        case .configurationFault(let error):
            return await context.pause(clientID: job.clientID, error: error, job: job, logger: logger)
        case .retryable, .rateLimited:
            if job.attempt >= job.maxAttempts {
                return await linkFailed(job, reason: "exchange_retries_exhausted", logger: logger)
            }
            return context.retry(outcome, job: job, logger: logger) ?? .failed(error: "unexpected")
        }
    }

    /// Ends the link attempt: code removed, `link_failed` recorded, job completed; account untouched.
    func linkFailed(_ job: Job, reason: String, logger: Logger) async -> JobResult {
        let result = await context.commitWithCompletion(job, outcome: "link_failed", logger: logger) { connection in
            _ = try await connection.execute("UPDATE siwa.jobs SET args = args - 'code' WHERE id = \(job.id)")
            _ = try await connection.query(
                "SELECT siwa.record_change(\(job.clientID), \(job.sub), 'link_failed', \(reason), NULL, \(job.id))")
        }
        if result == .completedByHandler {
            context.metrics?.linkFailed.increment()
            logger.warning("account link failed", metadata: ["link.reason": .string(reason)])
        }
        return result
    }
}
