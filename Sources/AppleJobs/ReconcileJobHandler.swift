import AppleClient
package import JobQueue
package import Logging
package import Postgres
import Metrics
import StoredTokens

/// Opt-in reconciliation (`SIWA_RECONCILE=daily`): asks Apple whether an active account's refresh
/// token still works, at most once a day (which accounts: `siwa.reconcile_skip`). `invalid_grant`
/// means the user withdrew consent without us hearing of it: the account becomes `consent_revoked`
/// exactly as the notification would make it.
package struct ReconcileJobHandler: JobHandler {
    package let kind = JobKind.reconcile
    let context: AppleJobContext

    package init(context: AppleJobContext) {
        self.context = context
    }

    package func run(_ job: Job, logger parent: Logger) async -> JobResult {
        let logger = parent.with(job.idMetadata)
        // Whether the account is reconciled at all is siwa.reconcile_skip's (sql/functions/accounts.sql):
        // the token comes back only when it is due, else the reason, which is the job's outcome.
        let account: (skipped: String?, token: [UInt8]?)
        do {
            account = try await context.pool.withConnection { connection in
                let row = try await connection.query(
                    "SELECT skipped, refresh_token_enc FROM siwa.reconcile_token(\(job.clientID), \(job.sub))")[0]
                return (try row.decode(String?.self, column: "skipped"), try row.decode([UInt8]?.self, column: "refresh_token_enc"))
            }
        } catch {
            return .databaseFailure(error, operation: "reconcile_read", logger: logger)
        }
        guard account.skipped == nil, let stored = account.token else {
            return .completed(outcome: account.skipped ?? "skipped")
        }
        let refreshToken: String
        do {
            refreshToken = try context.tokenBox.open(stored, clientID: job.clientID, sub: job.sub)
        } catch {
            logger.error("cannot decrypt the refresh token to check it; check SIWA_TOKEN_KEYS", metadata: ["error": "\(error)"])
            return .completed(outcome: "token_undecryptable")
        }
        do {
            if case .paused(let wait) = try await context.pauseCheck(clientID: job.clientID) {
                return .snoozed(reason: "client_paused", for: wait)
            }
        } catch {
            return .databaseFailure(error, operation: "pause_check", logger: logger)
        }

        let outcome = await context.client.refresh(refreshToken: refreshToken, clientID: job.clientID)
        switch outcome {
        case .success:
            await context.resume(clientID: job.clientID, logger: logger)
            return await report("valid", tested: stored, job: job, logger: logger)
        case .invalidGrant:
            await context.resume(clientID: job.clientID, logger: logger)
            return await report("invalid_grant", tested: stored, job: job, logger: logger)
        case .configurationFault(let error):
            return await context.pause(clientID: job.clientID, error: error, job: job, logger: logger)
        case .otherClientError(let status, let error):
            return .failed(error: "apple_\(status)_\(error ?? "error")")
        case .retryable, .rateLimited:
            return context.retry(outcome, job: job, logger: logger) ?? .failed(error: "unexpected")
        }
    }

    /// Hands Apple's answer for the `tested` token to `siwa.reconcile_result`, which acts only if that
    /// token is still the stored one (a relink meanwhile is not undone) and completes the job.
    private func report(_ answer: String, tested: [UInt8], job: Job, logger: Logger) async -> JobResult {
        do {
            let outcome = try await context.pool.withConnection { connection in
                try await connection.query("SELECT siwa.reconcile_result(\(job.id), \(job.attempt)::integer, \(tested), \(answer))")[0]
                    .decode(String?.self, at: 0)
            }
            switch outcome {
            case nil: logger.warning("job lease lost before completion; nothing written")
            case "consent_revoked"?:
                context.metrics?.consentRevoked.increment()
                logger.info("reconciliation found consent revoked")
            default: break
            }
            return .completedByHandler
        } catch {
            return .databaseFailure(error, operation: "reconcile_result", logger: logger)
        }
    }
}

/// Queues `reconcile` jobs for active accounts whose token was not checked in the last 24 hours,
/// in small batches, never two open jobs for one account. `run()` does it every `interval`.
package struct ReconcileScheduler: Sendable {
    let pool: PostgresPool
    let logger: Logger
    package var batchSize: Int
    package var interval: Duration

    package init(pool: PostgresPool, logger: Logger, batchSize: Int = 100, interval: Duration = .seconds(600)) {
        self.pool = pool
        self.logger = logger
        self.batchSize = batchSize
        self.interval = interval
    }

    /// Queues at most `batchSize` jobs; returns how many.
    package func queueBatch() async throws -> Int {
        // `siwa.queue_reconciles` (sql/functions/accounts.sql): which accounts are due is the account rules'.
        try await pool.withConnection { connection in
            try await connection.query("SELECT siwa.queue_reconciles(\(batchSize)::integer)")[0].decode(Int.self, at: 0)
        }
    }

    /// One batch per `interval` until cancelled; errors are logged and retried next time.
    package func run() async {
        while !Task.isCancelled {
            do {
                let queued = try await queueBatch()
                if queued > 0 { logger.info("reconcile jobs queued", metadata: ["jobs.queued": .int(queued)]) }
            } catch {
                logger.warning("could not queue reconcile jobs", metadata: ["error": "\(error)"])
            }
            try? await Task.sleep(for: interval)
        }
    }
}
