package import Logging

/// Runs `body` again while it fails with a connection problem (a restart, or a failover while the old
/// primary is gone and the new one is not yet writable), for at most `window`; then the last error is
/// thrown. Waits grow from 100 ms to 2 s between tries. Pool leases reconnect on their own: a
/// connection that failed this way is discarded, and the next lease finds the writable host.
///
/// Only for a body that is safe to run twice: when a COMMIT's answer is lost, it may have happened.
/// Fenced job writes are (`WHERE … AND attempt = …` matches nothing the second time).
package func retryingConnectionProblems<T>(
    for window: Duration, operation: String, logger: Logger,
    isolation: isolated (any Actor)? = #isolation, _ body: () async throws -> T
) async throws -> T {
    let deadline = ContinuousClock.now + window
    var delay: Duration = .milliseconds(100)
    var attempt = 1
    while true {
        do {
            let value = try await body()
            if attempt > 1 {
                logger.info(
                    "database reachable again; retry succeeded",
                    metadata: ["db.operation": .string(operation), "attempt": .int(attempt)])
            }
            return value
        } catch where error.isPostgresConnectionProblem && ContinuousClock.now + delay < deadline {
            if attempt == 1 {
                logger.warning(
                    "database connection problem; retrying on a new connection",
                    metadata: ["db.operation": .string(operation), "error": "\(error)"])
            }
            try await Task.sleep(for: delay)
            delay = min(delay * 2, .seconds(2))
            attempt += 1
        }
    }
}
