package import CryptoCore
import Foundation
package import Logging
import JOSE
import Locking
package import Metrics

/// Apple's signing keys (`{base}/auth/keys`), cached.
///
/// Lookups of a known `kid` are a lock and a dictionary read, cheap enough for every request. An
/// unknown `kid` triggers one refetch, single-flighted and rate-limited so no stream of forged
/// tokens can make us hammer Apple. When Apple is unreachable the last good set keeps serving.
package final class AppleKeySet: Sendable {
    package enum Lookup: Sendable {
        case found(RSA.PublicKey)
        /// Apple's current set does not have this kid: the token is not Apple's (401).
        case unknownKey
        /// We could not ask Apple and have no such key: try again later (503).
        case unavailable
    }

    private struct State {
        var keys: [String: RSA.PublicKey] = [:]
        var fetchedAt: Date?
        var lastAttemptAt: Date?
        var inFlight: Task<Bool, Never>?
    }

    private let http: AppleHTTP
    private let logger: Logger
    private let minimumRefetchInterval: Duration
    private let state = Locked(State())
    package let refreshes: Counter?
    package let refreshFailures: Counter?

    package init(
        http: AppleHTTP, logger: Logger, minimumRefetchInterval: Duration = .seconds(10),
        metrics: MetricsSink? = nil
    ) {
        self.http = http
        self.logger = logger
        self.minimumRefetchInterval = minimumRefetchInterval
        self.refreshes = metrics?.refreshes
        self.refreshFailures = metrics?.failures
    }

    /// Counters for `/metrics`, owned by the caller's registry.
    package struct MetricsSink: Sendable {
        package var refreshes: Counter
        package var failures: Counter
        package init(refreshes: Counter, failures: Counter) {
            self.refreshes = refreshes
            self.failures = failures
        }
    }

    /// A key set that starts out holding `keys` (tests, tools): lookups of other kids still go to `http`.
    package convenience init(keys: [String: RSA.PublicKey], http: AppleHTTP, logger: Logger) {
        self.init(http: http, logger: logger)
        state.withLock { state in
            state.keys = keys
            state.fetchedAt = Date()
        }
    }

    package var hasKeys: Bool { state.withLock { !$0.keys.isEmpty } }
    package var keyIDs: [String] { state.withLock { $0.keys.keys.sorted() } }
    /// Seconds since the last successful fetch, for `/metrics`.
    package var age: Double? { state.withLock { $0.fetchedAt.map { Date().timeIntervalSince($0) } } }

    /// The cached key, without waiting: nil when the kid is not cached.
    package func cachedKey(_ keyID: String) -> RSA.PublicKey? {
        state.withLock { $0.keys[keyID] }
    }

    /// The key for `keyID`, refetching once if it is not cached. `unknownKey` only when a fetch
    /// of Apple's set really happened for it (this call's, or one in flight it joined) and the
    /// kid is not there; a fetch that failed, or that the rate limit skipped, is `unavailable`.
    package func key(_ keyID: String) async -> Lookup {
        if let key = cachedKey(keyID) { return .found(key) }
        let attempt = await refresh(force: false)
        return state.withLock { state in
            if let key = state.keys[keyID] { return .found(key) }
            return attempt == .fetched ? .unknownKey : .unavailable
        }
    }

    /// What `refresh` did.
    package enum Attempt: Sendable, Equatable {
        /// Apple's set was fetched (by this call or by one in flight it joined).
        case fetched
        /// A fetch was tried and failed; the last good set keeps serving.
        case failed
        /// One was fetched or tried within the minimum interval: nothing was asked.
        case skipped
    }

    /// Fetches the set unless one was fetched (or tried) within the minimum interval; concurrent
    /// callers share one fetch.
    @discardableResult
    package func refresh(force: Bool) async -> Attempt {
        let task: Task<Bool, Never>? = state.withLock { state in
            if let inFlight = state.inFlight { return inFlight }
            if !force, let last = state.lastAttemptAt,
                Date().timeIntervalSince(last) < minimumRefetchInterval.seconds
            {
                return nil
            }
            state.lastAttemptAt = Date()
            let fetch = Task { await self.fetch() }
            state.inFlight = fetch
            return fetch
        }
        guard let task else { return .skipped }
        return await task.value ? .fetched : .failed
    }

    /// Bound on one fetch of the set, whatever the client's own: a request that needs a key not
    /// cached (a sign-in, a notification) waits at most this for it, then 503 `keys_unavailable`
    /// (Sources/AppAPI/README.md, "The edge"). A caller joining a fetch in flight waits for less.
    package static let fetchTimeout: Duration = .seconds(5)

    private func fetch() async -> Bool {
        refreshes?.increment()
        var succeeded = false
        defer {
            state.withLock { $0.inFlight = nil }
            if !succeeded { refreshFailures?.increment() }
        }
        do {
            let response = try await http.get("auth/keys", timeout: Self.fetchTimeout)
            guard response.status == 200 else {
                logger.warning("Apple key set fetch answered \(response.status)", metadata: ["http.status": .int(response.status)])
                return false
            }
            let keys = try JSONWebKeySet(jsonBytes: response.body).rs256Keys()
            guard !keys.isEmpty else {
                logger.warning("Apple key set has no RS256 RSA key; keeping the last good set")
                return false
            }
            state.withLock { state in
                state.keys = keys
                state.fetchedAt = Date()
            }
            succeeded = true
            logger.info("Apple key set loaded", metadata: ["jwks.kids": .string(keys.keys.sorted().joined(separator: ","))])
            return true
        } catch {
            logger.warning("Apple key set fetch failed; keeping the last good set", metadata: ["error": "\(error)"])
            return false
        }
    }

    /// Keeps the set fresh: fetches at start (retrying quickly until the first success), then hourly.
    package func run() async {
        var delay = Duration.seconds(1)
        while !Task.isCancelled {
            if await refresh(force: true) == .fetched {
                delay = .seconds(1)
                try? await Task.sleep(for: .seconds(3600))
            } else {
                try? await Task.sleep(for: delay)
                delay = min(delay * 2, .seconds(60))
            }
        }
    }
}

