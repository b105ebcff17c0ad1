package import Logging

/// The one shape both mains run (`siwa-receiver`'s `Receiver`, `siwa-worker`'s `WorkerService`):
/// `run()` serves until the task running it is cancelled, then stops gracefully (stops taking
/// work, finishes what is in flight within its own bound) and returns. It throws when it cannot
/// run. Cancellation means that and only that, in every service: signals belong to `main`, which
/// turns the first SIGTERM or SIGINT into a cancellation (`runUntilSignalled`).
package protocol Service: Sendable {
    func run() async throws
}

extension Service {
    /// Runs the service until it returns, or until SIGTERM or SIGINT, which cancels it; returns (or
    /// throws its error) once it has stopped.
    package func runUntilSignalled(name: String, logger: Logger) async throws {
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await self.run() }
            group.addTask {
                if let signal = await Termination.signal() {
                    logger.info("\(name) signalled", metadata: ["signal": .string(signal)])
                }
            }
            // The first to end, the service (failing or done) or the wait for a signal, cancels the other.
            try await group.next()
            group.cancelAll()
            try await group.waitForAll()
        }
    }
}
