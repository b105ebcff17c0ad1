import AppleClient
import Foundation
package import JobQueue
package import Logging
import Postgres
import Metrics
import StoredTokens

/// Finishes a deletion requested with `siwa.request_deletion`. `siwa.revoke_step` decides each step
/// under the account's row lock (sql/functions/accounts.sql): wait for an exchange still queued for
/// the account, revoke the next stored token, or, with none left, mark the account deleted in the
/// same transaction that completes the job. This handler only revokes at Apple what it is handed and
/// reports each 200 with `siwa.revoke_succeeded`. A pending deletion is never dropped: every failure
/// retries (the job has no attempt limit) and a refused client ID snoozes until it is fixed.
package struct RevokeJobHandler: JobHandler {
    package let kind = JobKind.revoke
    let context: AppleJobContext
    /// Tokens revoked in one run before the job yields (a deletion rarely has more than two).
    var stepsPerRun = 16

    package init(context: AppleJobContext) {
        self.context = context
    }

    struct Step {
        var action: String
        var token: [UInt8]?
        var wait: Double?
    }

    package func run(_ job: Job, logger parent: Logger) async -> JobResult {
        let logger = parent.with(job.idMetadata)
        for _ in 0..<stepsPerRun {
            let step: Step
            do {
                step = try await context.pool.withConnection { connection in
                    let row = try await connection.query(
                        "SELECT action, token_enc, wait_seconds FROM siwa.revoke_step(\(job.id), \(job.attempt)::integer)")[0]
                    return Step(
                        action: try row.decode(String.self, column: "action"),
                        token: try row.decode([UInt8]?.self, column: "token_enc"),
                        wait: try row.decode(Double?.self, column: "wait_seconds"))
                }
            } catch {
                return .databaseFailure(error, operation: "revoke_step", logger: logger)
            }
            switch (step.action, step.token) {
            case ("revoke", let token?):
                if let result = await revoke(token, job: job, logger: logger) { return result }
            case ("wait", _):
                return .snoozed(reason: "exchange_pending", for: .seconds(step.wait ?? 1))
            case ("deleted", _):
                context.metrics?.deleted.increment()
                logger.info("account deleted")
                return .completedByHandler
            case ("lost", _):
                logger.warning("job lease lost; the deletion continues in the run that holds it")
                return .completedByHandler
            default:  // done, superseded: completed by revoke_step
                logger.info("revoke job finished", metadata: ["outcome": .string(step.action)])
                return .completedByHandler
            }
        }
        return .failed(error: "revoke_steps_exhausted")
    }

    /// Revokes one stored token; nil when Apple accepted it (the next step follows), else the job's result.
    private func revoke(_ stored: [UInt8], job: Job, logger: Logger) async -> JobResult? {
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
            return .databaseFailure(error, operation: "pause_check", logger: logger)
        }

        let outcome = await context.client.revoke(refreshToken: refreshToken, clientID: job.clientID)
        switch outcome {
        case .success, .invalidGrant:
            // invalid_grant: the token is already dead at Apple, which is what a revoke wants.
            await context.resume(clientID: job.clientID, logger: logger)
            do {
                // A failover must not turn Apple's answer into a second call: recording is
                // idempotent (the token is removed once), so it is retried on a new connection,
                // which finds the promoted standby.
                _ = try await retryingConnectionProblems(
                    for: context.recordRetryWindow, operation: "record revoke", logger: logger
                ) {
                    try await context.pool.withConnection { connection in
                        try await connection.query("SELECT siwa.revoke_succeeded(\(job.id), \(stored))")
                    }
                }
            } catch {
                // Revoked at Apple but not recorded: the next run revokes it again (Apple answers 200).
                return .databaseFailure(error, operation: "revoke_succeeded", logger: logger)
            }
            return nil
        case .configurationFault(let error):
            return await context.pause(clientID: job.clientID, error: error, job: job, logger: logger)
        case .otherClientError(let status, let error):
            logger.error("Apple refused the revoke; will retry", metadata: ["http.status": .int(status), "apple.error": .string(error ?? "")])
            return .failed(error: "apple_\(status)_\(error ?? "error")")
        case .retryable, .rateLimited:
            return context.retry(outcome, job: job, logger: logger) ?? .failed(error: "unexpected")
        }
    }
}
