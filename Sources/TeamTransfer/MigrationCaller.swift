package import AppleClient
package import JobQueue
package import Logging

/// Apple refused the credentials of `clientID` (`invalid_client`, `unauthorized_client`, or no
/// migration access token at all): a configuration fault that stops a transfer command at once.
package struct MigrationConfigurationFault: Error, CustomStringConvertible {
    package var clientID: String
    package var error: String

    package var description: String {
        "Apple rejected the credentials for client ID \(clientID) (\(error)): check SIWA_TEAM_ID, SIWA_KEY_ID, SIWA_PRIVATE_KEY_FILE and that this team owns the client ID"
    }
}

/// How a transfer command calls Apple: rate, concurrency and retries.
package struct MigrationCallSettings: Sendable {
    /// Calls started per second, at most (all of a command's calls together).
    package var rate: Double
    /// Calls in flight at once.
    package var concurrency: Int
    /// Backoff between attempts for one account, as for revokes (full jitter, doubling).
    package var retry: RetryPolicy
    /// Attempts per account in one run; an account still failing is counted and left for the next run.
    package var maxAttempts: Int

    package init(rate: Double = 20, concurrency: Int = 4, retry: RetryPolicy = RetryPolicy(base: .seconds(1), cap: .seconds(60)), maxAttempts: Int = 8) {
        self.rate = rate
        self.concurrency = concurrency
        self.retry = retry
        self.maxAttempts = maxAttempts
    }
}

/// One client ID's calls to `usermigrationinfo`: holds the migration access token (asked once, asked
/// again when it nears its end or Apple refuses it), spaces calls to the configured rate, retries
/// 5xx, timeouts and 429 with backoff (a 429 also holds back every other call for its
/// `Retry-After`), and turns `invalid_client` into `MigrationConfigurationFault`.
package actor MigrationCaller {
    /// What became of one account's call after every attempt.
    package enum Outcome<Value: Sendable>: Sendable {
        case success(Value)
        /// Not obtained in this run; `reason` is the classified answer (`http_503`, `invalid_request`).
        case failed(reason: String)
    }

    private let client: AppleAuthClient
    private let clientID: String
    private let settings: MigrationCallSettings
    private let logger: Logger
    private var token: (value: String, renewAfter: ContinuousClock.Instant)?
    private var pendingToken: Task<String, any Error>?
    private var nextStart = ContinuousClock.now
    private var heldUntil = ContinuousClock.now

    package init(client: AppleAuthClient, clientID: String, settings: MigrationCallSettings, logger: Logger) {
        self.client = client
        self.clientID = clientID
        self.settings = settings
        self.logger = logger
    }

    /// Runs `call` with the current access token until it succeeds, fails for this account, or
    /// runs out of attempts. Throws `MigrationConfigurationFault` (stop everything) or
    /// `CancellationError`.
    package func perform<Value: Sendable & Equatable>(
        _ call: @Sendable (_ accessToken: String) async -> AppleCallOutcome<Value>
    ) async throws -> Outcome<Value> {
        var renewedForThisAccount = false
        var lastReason = "not_attempted"
        for attempt in 1...max(1, settings.maxAttempts) {
            let accessToken = try await currentToken()
            try await waitForTurn()
            switch await call(accessToken) {
            case .success(let value):
                return .success(value)
            case .configurationFault(let error):
                throw MigrationConfigurationFault(clientID: clientID, error: error)
            case .invalidGrant, .otherClientError(status: 401, _):
                // Apple's answer for an expired or consumed access token: ask for a new one, once.
                guard !renewedForThisAccount else { return .failed(reason: "invalid_grant") }
                renewedForThisAccount = true
                if token?.value == accessToken { token = nil }
                continue
            case .otherClientError(let status, let code):
                return .failed(reason: code ?? "http_\(status)")
            case .retryable(let reason):
                lastReason = reason
            case .rateLimited(let retryAfter):
                lastReason = "rate_limited"
                if let retryAfter { holdBack(for: retryAfter) }
            }
            guard attempt < settings.maxAttempts else { break }
            let delay = settings.retry.delay(afterFailures: attempt)
            logger.debug(
                "apple migration call failed; retrying",
                metadata: ["client_id": .string(clientID), "apple.reason": .string(lastReason), "attempt": .int(attempt)])
            try await Task.sleep(for: delay)
        }
        return .failed(reason: lastReason)
    }

    /// The access token, asked for when there is none or it is within five minutes of Apple's
    /// stated lifetime. The token call is retried like any other; anything else it answers is fatal.
    private func currentToken() async throws -> String {
        if let token, ContinuousClock.now < token.renewAfter { return token.value }
        // Concurrent calls share one request for a new token.
        if let pendingToken { return try await pendingToken.value }
        let request = Task { try await self.requestToken() }
        pendingToken = request
        defer { pendingToken = nil }
        return try await request.value
    }

    private func requestToken() async throws -> String {
        for attempt in 1...max(1, settings.maxAttempts) {
            try await waitForTurn()
            switch await client.migrationAccessToken(clientID: clientID) {
            case .success(let answer):
                let lifetime = answer.lifetime ?? .seconds(3600)
                let margin = min(.seconds(300), lifetime / 2)
                token = (answer.value, ContinuousClock.now + lifetime - margin)
                return answer.value
            case .configurationFault(let error):
                throw MigrationConfigurationFault(clientID: clientID, error: error)
            case .invalidGrant:
                throw MigrationConfigurationFault(clientID: clientID, error: "invalid_grant")
            case .otherClientError(let status, let code):
                throw MigrationConfigurationFault(clientID: clientID, error: code ?? "http_\(status)")
            case .rateLimited(let retryAfter):
                if let retryAfter { holdBack(for: retryAfter) }
            case .retryable:
                break
            }
            guard attempt < settings.maxAttempts else { break }
            try await Task.sleep(for: settings.retry.delay(afterFailures: attempt))
        }
        throw MigrationUnavailable(clientID: clientID)
    }

    /// Waits for this call's slot: calls start at most `rate` per second, and none while held back.
    private func waitForTurn() async throws {
        let interval = Duration.milliseconds(Int64((1000 / max(settings.rate, 0.001)).rounded()))
        let start = max(nextStart, heldUntil, ContinuousClock.now)
        nextStart = start + interval
        if start > ContinuousClock.now { try await Task.sleep(until: start, clock: .continuous) }
    }

    private func holdBack(for duration: Duration) {
        heldUntil = max(heldUntil, ContinuousClock.now + min(duration, RetryAfter.maximum))
    }
}

/// Apple could not be reached for a migration access token after every attempt.
package struct MigrationUnavailable: Error, CustomStringConvertible {
    package var clientID: String
    package var description: String {
        "could not obtain a migration access token for client ID \(clientID): Apple unreachable or failing (5xx, 429, timeouts); run again later"
    }
}
