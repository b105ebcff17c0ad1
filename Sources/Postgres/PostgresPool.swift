package import Logging
import Locking

/// A fixed-size pool of lazily opened connections.
///
/// `withConnection` leases a connection: an idle one (checked with a non-blocking socket probe), or a
/// new one while fewer than `size` are open, or else the next one released — waiting at most
/// `acquireTimeout` (then `PostgresError.timeout`). A connection whose status is bad, or whose body
/// threw a connection problem, is discarded on release; the next lease reconnects. So after a server
/// restart, calls fail with connection problems while the server is down and succeed once it is back.
package final class PostgresPool: Sendable {
    package let size: Int
    package let acquireTimeout: Duration
    private let conninfo: String
    private let applicationName: String
    private let limits: SessionLimits
    /// Its connections await replies on `ReplyWatcher` (`PostgresConnection.watchesReplies`).
    private let watchingReplies: Bool
    private let logger: Logger
    private let state = Locked(State())

    private enum Grant: Sendable {
        case connection(PostgresConnection)
        /// Permission to open a new connection (a slot under `size` is reserved for the holder).
        case slot
    }

    private struct Waiter {
        var continuation: CheckedContinuation<Grant, any Error>?
        var outcome: Result<Grant, any Error>?
    }

    private struct State {
        var idle: [PostgresConnection] = []
        /// Connections open or being opened, leased or idle.
        var open = 0
        var waiters: [UInt64: Waiter] = [:]
        /// Waiting ids, oldest first, that have no outcome yet.
        var queue: [UInt64] = []
        var nextWaiter: UInt64 = 0
        var closed = false

        /// Hands `grant` to the oldest waiter; false when nobody waits.
        mutating func handToWaiter(_ grant: Grant) -> Bool {
            guard !queue.isEmpty else { return false }
            deliver(.success(grant), to: queue.removeFirst())
            return true
        }

        mutating func deliver(_ outcome: Result<Grant, any Error>, to id: UInt64) {
            guard var waiter = waiters[id], waiter.outcome == nil else { return }
            queue.removeAll { $0 == id }
            if let continuation = waiter.continuation {
                waiters[id] = nil
                continuation.resume(with: outcome)
            } else {
                waiter.outcome = outcome
                waiters[id] = waiter
            }
        }
    }

    /// `conninfo` is a URI or `key=value` string; it is never logged.
    package init(
        conninfo: String, size: Int, acquireTimeout: Duration = .seconds(5), applicationName: String = "siwa",
        limits: SessionLimits = .none, watchingReplies: Bool = false, logger: Logger
    ) {
        precondition(size > 0, "pool size must be positive")
        self.watchingReplies = watchingReplies
        self.conninfo = conninfo
        self.size = size
        self.acquireTimeout = acquireTimeout
        self.applicationName = applicationName
        self.limits = limits
        self.logger = logger
    }

    /// Leases a connection for `body` and returns it afterwards (or discards it, see the type's doc).
    package func withConnection<T: Sendable>(
        isolation: isolated (any Actor)? = #isolation, _ body: (PostgresConnection) async throws -> T
    ) async throws -> T {
        let connection = try await lease()
        let value: T
        do {
            value = try await body(connection)
        } catch {
            release(connection, discard: error.isPostgresConnectionProblem || !connection.isUsable)
            throw error
        }
        release(connection, discard: !connection.isUsable)
        return value
    }

    /// Closes idle connections now and leased ones when they come back; waiting leases fail.
    package func close() {
        let idle = state.withLock { state -> [PostgresConnection] in
            state.closed = true
            for id in state.queue {
                state.deliver(.failure(PostgresError(.poolClosed, message: "the pool was closed")), to: id)
            }
            let idle = state.idle
            state.open -= idle.count
            state.idle = []
            return idle
        }
        idle.forEach { $0.close() }
    }

    /// Counts for tests and metrics.
    package var openConnections: Int { state.withLock { $0.open } }
    package var idleConnections: Int { state.withLock { $0.idle.count } }

    // MARK: Leasing

    private enum LeaseStep {
        case grant(Grant)
        case wait(UInt64)
        case fail(PostgresError)
    }

    private func lease() async throws -> PostgresConnection {
        let step = state.withLock { state -> LeaseStep in
            if state.closed { return .fail(PostgresError(.poolClosed, message: "the pool was closed")) }
            if let connection = state.idle.popLast() { return .grant(.connection(connection)) }
            if state.open < size {
                state.open += 1
                return .grant(.slot)
            }
            let id = state.nextWaiter
            state.nextWaiter += 1
            state.waiters[id] = Waiter()
            state.queue.append(id)
            return .wait(id)
        }
        switch step {
        case .fail(let error): throw error
        case .grant(let grant): return try await connection(for: grant)
        case .wait(let id): return try await connection(for: try await waitForGrant(id))
        }
    }

    /// Turns a grant into a usable connection, reconnecting when the granted one is dead.
    private func connection(for grant: Grant) async throws -> PostgresConnection {
        if case .connection(let connection) = grant {
            if connection.isUsable, connection.checkHealthHere() { return connection }
            logger.debug("postgres pool discards a broken connection")
            connection.close()  // its slot is reused for the new connection below
        }
        do {
            return try await PostgresConnection.connect(
                to: conninfo, applicationName: applicationName, limits: limits, watchingReplies: watchingReplies,
                logger: logger)
        } catch {
            releaseSlot()
            throw error
        }
    }

    /// Waits for `release` to hand this waiter a grant. The bound is an entry in `DeadlineTimer`
    /// (no task, no timer of its own), and cancelling the task ends the wait at once.
    private func waitForGrant(_ id: UInt64) async throws -> Grant {
        let timeout = acquireTimeout
        let timer = DeadlineTimer.shared.schedule(after: timeout) { [self] in
            let error = PostgresError(.timeout, message: "no pooled connection became free within \(timeout)")
            state.withLock { $0.deliver(.failure(error), to: id) }
        }
        defer { DeadlineTimer.shared.cancel(timer) }
        return try await withTaskCancellationHandler {
            // `deliver` resumes under the lock, so taking it again after the await waits for that
            // unlock: an order ThreadSanitizer sees also when the resume came before the await
            // (see `QueueHandOff`), for whatever the releasing task did before handing over.
            defer { self.state.withLock { _ in } }
            return try await withCheckedThrowingContinuation { continuation in
                self.state.withLock { state in
                    guard var waiter = state.waiters[id] else { return }
                    if let outcome = waiter.outcome {
                        state.waiters[id] = nil
                        continuation.resume(with: outcome)
                    } else {
                        // Written back whole: `waiters[id]?.continuation = ...` allocated eight
                        // times a call (Swift 6.3, optional chaining through the subscript).
                        waiter.continuation = continuation
                        state.waiters[id] = waiter
                    }
                }
            }
        } onCancel: {
            self.state.withLock { $0.deliver(.failure(CancellationError()), to: id) }
        }
    }

    private func release(_ connection: PostgresConnection, discard: Bool) {
        let close = state.withLock { state -> Bool in
            if discard || state.closed {
                if state.closed || !state.handToWaiter(.slot) { state.open -= 1 }
                return true
            }
            if !state.handToWaiter(.connection(connection)) { state.idle.append(connection) }
            return false
        }
        if close {
            if discard { logger.debug("postgres pool discards a connection") }
            connection.close()
        }
    }

    private func releaseSlot() {
        state.withLock { state in
            if state.closed || !state.handToWaiter(.slot) { state.open -= 1 }
        }
    }
}
