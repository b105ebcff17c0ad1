import AppleClient
import Foundation
package import JobQueue
package import Logging
import Postgres
import SiwaCore

/// Finishes a deletion requested with `siwa.request_deletion`: revokes the refresh token at Apple,
/// then in one transaction marks the account deleted, discards the token, erases personal data,
/// records `deleted` and completes the job. A pending deletion is never dropped: every failure
/// retries (the job has no attempt limit) and a refused client ID snoozes until it is fixed.
package struct RevokeJobHandler: JobHandler {
    package let kind = JobKind.revoke
    let context: AppleJobContext

    package init(context: AppleJobContext) {
        self.context = context
    }

    package func run(_ job: Job, logger parent: Logger) async -> JobResult {
        let logger = parent.with(job.idMetadata)
        let account: (status: String, token: [UInt8]?)?
        do {
            account = try await context.pool.withConnection { connection in
                let rows = try await connection.query(
                    "SELECT status, refresh_token_enc FROM siwa.accounts WHERE client_id = \(job.clientID) AND sub = \(job.sub)")
                guard let row = rows.first else { return nil }
                return (try row.decode(String.self, column: "status"), try row.decode([UInt8]?.self, column: "refresh_token_enc"))
            }
        } catch {
            return .failed(error: "database_error")
        }
        guard let account, account.status == "pending_deletion" else { return .completed(outcome: "superseded") }
        guard let stored = account.token else { return await finish(job, outcome: "deleted_without_token", logger: logger) }

        let refreshToken: String
        do {
            refreshToken = try context.tokenBox.open(stored, clientID: job.clientID, sub: job.sub)
        } catch {
            // Keep retrying: an operator can restore the key; dropping would leave the grant alive at Apple.
            logger.error("cannot decrypt the refresh token to revoke it; check SIWA_TOKEN_KEYS", metadata: ["error": "\(error)"])
            return .failed(error: "token_undecryptable")
        }
        do {
            if case .paused(let wait) = try await context.pauseCheck(clientID: job.clientID) {
                return .snoozed(reason: "client_paused", for: wait)
            }
        } catch {
            return .failed(error: "database_error")
        }

        let outcome = await context.client.revoke(refreshToken: refreshToken, clientID: job.clientID)
        switch outcome {
        case .success, .invalidGrant:
            // invalid_grant: the token is already dead at Apple, which is what a revoke wants.
            await context.resume(clientID: job.clientID, logger: logger)
            return await finish(job, outcome: "deleted", logger: logger)
        case .configurationFault(let error):
            return await context.pause(clientID: job.clientID, error: error, job: job, logger: logger)
        case .otherClientError(let status, let error):
            logger.error("Apple refused the revoke; will retry", metadata: ["http.status": .int(status), "apple.error": .string(error ?? "")])
            return .failed(error: "apple_\(status)_\(error ?? "error")")
        case .retryable, .rateLimited:
            return context.retry(outcome, job: job, logger: logger) ?? .failed(error: "unexpected")
        }
    }

    /// Marks the account deleted (if it is still pending deletion) and completes the job, together.
    func finish(_ job: Job, outcome: String, logger: Logger) async -> JobResult {
        let result = await context.commitWithCompletion(job, outcome: outcome, logger: logger) { connection in
            let updated = try await connection.execute(
                """
                UPDATE siwa.accounts
                   SET status = 'deleted', refresh_token_enc = NULL,
                       sessions_revoked_at = coalesce(sessions_revoked_at, now()), updated_at = now()
                 WHERE client_id = \(job.clientID) AND sub = \(job.sub) AND status = 'pending_deletion'
                """)
            guard updated == 1 else { return }  // relinked meanwhile: nothing to delete
            _ = try await connection.query("SELECT siwa.erase_personal_data(\(job.clientID), \(job.sub))")
            _ = try await connection.query(
                "SELECT siwa.record_change(\(job.clientID), \(job.sub), 'deleted', NULL, NULL, \(job.id))")
        }
        if result == .completedByHandler {
            context.metrics?.deleted.increment()
            logger.info("account deleted", metadata: ["outcome": .string(outcome)])
        }
        return result
    }
}
