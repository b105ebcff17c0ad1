package import AppleClient
package import StoredTokens
package import Foundation
import JobQueue
import Logging
package import Postgres
import Metrics

/// What the Apple handlers share: the database, the Apple client, the token box and the
/// pause bookkeeping for client IDs Apple refuses.
package struct AppleJobContext: Sendable {
    package var pool: PostgresPool
    package var client: AppleAuthClient
    package var tokenBox: TokenBox
    package var identityVerifier: IdentityTokenVerifier
    package var metrics: AppleMetrics?
    /// How long a client ID stays paused before one job probes it again.
    package var pauseInterval: Duration = .seconds(300)
    /// Authorization codes live five minutes at Apple.
    package var codeLifetime: TimeInterval = 300
    /// How long recording what Apple answered is retried through a database outage (a failover):
    /// the default job lease, past which another run may own the job anyway.
    package var recordRetryWindow: Duration = .seconds(60)

    package init(
        pool: PostgresPool, client: AppleAuthClient, tokenBox: TokenBox, identityVerifier: IdentityTokenVerifier,
        metrics: AppleMetrics? = nil
    ) {
        self.pool = pool
        self.client = client
        self.tokenBox = tokenBox
        self.identityVerifier = identityVerifier
        self.metrics = metrics
    }

    // MARK: Paused client IDs

    enum PauseCheck { case proceed, paused(Duration) }

    /// Whether calls for `clientID` may go to Apple now. A paused client lets one job through per
    /// `pauseInterval` as the probe (moving `next_probe_at` so concurrent jobs keep waiting).
    func pauseCheck(clientID: String) async throws -> PauseCheck {
        let interval = Double(pauseInterval.components.seconds)
        let wait = try await pool.withConnection { connection in
            try await connection.query("SELECT siwa.paused_client_wait(\(clientID), \(interval)::float8)")[0]
                .decode(Double?.self, at: 0)
        }
        guard let wait, wait > 0 else { return .proceed }
        return .paused(.seconds(wait.rounded(.up)))
    }

    /// Apple refused our credentials for `clientID`: pause its calls, say so loudly, snooze the job.
    func pause(clientID: String, error: String, job: Job, logger: Logger) async -> JobResult {
        metrics?.configurationFaults.increment()
        logger.error(
            "Apple rejected the client credentials; calls for this client ID are paused. Check SIWA_TEAM_ID, SIWA_KEY_ID, SIWA_PRIVATE_KEY_FILE and the client ID",
            metadata: ["client_id": .string(clientID), "apple.error": .string(error), "job_id": .string(String(job.id))])
        let interval = Double(pauseInterval.components.seconds)
        do {
            try await pool.withConnection { connection in
                _ = try await connection.query(
                    "SELECT siwa.pause_client(\(clientID), \(error), \(interval)::float8)")
            }
        } catch {
            logger.warning("could not record the paused client", metadata: ["client_id": .string(clientID), "error": "\(error)"])
        }
        return .snoozed(reason: "client_paused:\(error)", for: pauseInterval)
    }

    /// A call for `clientID` succeeded: it is no longer paused.
    func resume(clientID: String, logger: Logger) async {
        do {
            let wasPaused = try await pool.withConnection { connection in
                try await connection.query("SELECT siwa.resume_client(\(clientID))")[0].decode(Bool.self, at: 0)
            }
            if wasPaused {
                logger.notice("Apple accepted the client credentials again; client ID resumed", metadata: ["client_id": .string(clientID)])
            }
        } catch {
            logger.warning("could not clear the paused client", metadata: ["client_id": .string(clientID), "error": "\(error)"])
        }
    }

    /// The result for a retryable or rate-limited failure.
    func retry<Value>(_ outcome: AppleCallOutcome<Value>, job: Job, logger: Logger) -> JobResult? {
        switch outcome {
        case .retryable(let reason):
            metrics?.retryableFailures.increment()
            logger.warning("Apple call failed; will retry", metadata: ["job_id": .string(String(job.id)), "apple.reason": .string(reason)])
            return .failed(error: reason)
        case .rateLimited(let retryAfter):
            metrics?.rateLimited.increment()
            logger.warning(
                "Apple rate-limited the call; will retry",
                metadata: ["job_id": .string(String(job.id)), "apple.retry_after_s": .double(retryAfter.map { Double($0.components.seconds) } ?? -1)])
            return .failed(error: "rate_limited", retryAfter: retryAfter)
        default:
            return nil
        }
    }
}

extension Job {
    /// `args` as a JSON object (empty when unreadable).
    var arguments: [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(argumentsJSON.utf8))) as? [String: Any] ?? [:]
    }

    var idMetadata: Logger.Metadata { ["job_id": .string(String(id)), "kind": .string(kind.rawValue), "client_id": .string(clientID)] }
}

extension JobResult {
    /// A database failure as the job's recorded error and one log line: which operation and which
    /// SQLSTATE (a lock timeout, a failover, a missing grant), never values, so `siwa jobs list`
    /// says why a job is retrying without anyone reading the worker's logs.
    static func databaseFailure(_ error: any Error, operation: String, logger: Logger) -> JobResult {
        let sqlState = (error as? PostgresError)?.sqlState ?? "none"
        logger.warning(
            "database error; the job will retry",
            metadata: ["db.operation": .string(operation), "db.sqlstate": .string(sqlState), "error": "\(error)"])
        return .failed(error: "database_error: \(operation) (SQLSTATE \(sqlState))")
    }
}
