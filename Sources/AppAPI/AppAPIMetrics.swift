import Locking
import Metrics

/// The app API's series on the worker's `/metrics`. Label values come from closed sets in this
/// module (endpoint names, the contract's statuses, exchange failure classes), so no request can
/// grow the series set; a series is registered the first time it is counted.
struct AppAPIMetrics: Sendable {
    private let registry: MetricsRegistry
    private let requests = Locked<[String: Counter]>([:])
    private let exchangeFailures = Locked<[String: Counter]>([:])
    private let refusals = Locked<[String: Counter]>([:])
    let signInSeconds: Histogram
    private let unkeptTokensQueued: Counter

    init(registry: MetricsRegistry) {
        self.registry = registry
        signInSeconds = registry.histogram(
            "siwa_app_api_sign_in_seconds", help: "POST /v1/sign-in, from the request to the answer (any status).",
            buckets: Histogram.requestBuckets)
        unkeptTokensQueued = registry.counter(
            "siwa_app_api_unkept_tokens_queued_total",
            help: "Refresh tokens a failed sign-in obtained and handed to a revoke job instead of keeping.")
    }

    func unkeptTokenQueued() { unkeptTokensQueued.increment() }

    func request(endpoint: String, status: Int) {
        let registry = registry
        requests.withLock { counters in
            let key = "\(endpoint) \(status)"
            let counter =
                counters[key]
                ?? registry.counter(
                    "siwa_app_api_requests_total", help: "App API requests by endpoint and status.",
                    labels: ["endpoint": endpoint, "status": String(status)])
            counters[key] = counter
            counter.increment()
        }
    }

    /// Connections the HTTP layer refused or cut off, by reason (`ConnectionRefusal`'s raw values).
    func connectionsRefused(_ reason: String, count: Int) {
        let registry = registry
        refusals.withLock { counters in
            let counter =
                counters[reason]
                ?? registry.counter(
                    "siwa_app_api_connections_refused_total",
                    help: "App API connections refused (per_address_limit, connection_limit) or closed for not sending a whole request in time (request_timeout).",
                    labels: ["reason": reason])
            counters[reason] = counter
            counter.increment(by: count)
        }
    }

    /// A sign-in's code exchange that did not give a token to keep, by why.
    func exchangeFailed(_ reason: String) {
        let registry = registry
        exchangeFailures.withLock { counters in
            let counter =
                counters[reason]
                ?? registry.counter(
                    "siwa_app_api_exchange_failures_total", help: "Sign-in code exchanges that failed, by reason.",
                    labels: ["reason": reason])
            counters[reason] = counter
            counter.increment()
        }
    }
}
