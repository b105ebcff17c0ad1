import Metrics

/// The webhook series on the worker's `/metrics` (deploy/README.md, "What to alert on").
struct WebhookMetrics: Sendable {
    static let failureReasons = ["timeout", "connection", "redirect", "client_error", "server_error", "other_status"]

    let delivered: Counter
    let failures: [String: Counter]
    let discarded: Counter
    /// Change committed → its 2xx answered.
    let deliveryDelay: Histogram
    /// One attempt's HTTP round trip, whatever the answer.
    let requestDuration: Histogram
    let inFlight: Gauge
    let oldestUndelivered: Gauge
    let undelivered: Gauge
    let discardedKept: Gauge

    init(registry: MetricsRegistry) {
        delivered = registry.counter("siwa_webhook_delivered_total", help: "Changes delivered (answered 2xx).")
        var failures: [String: Counter] = [:]
        for reason in Self.failureReasons {
            failures[reason] = registry.counter(
                "siwa_webhook_failures_total", help: "Delivery attempts that failed, by reason.", labels: ["reason": reason])
        }
        self.failures = failures
        discarded = registry.counter(
            "siwa_webhook_discarded_total", help: "Deliveries discarded after the retry window (kept; siwa jobs retry).")
        deliveryDelay = registry.histogram(
            "siwa_webhook_delivery_delay_seconds", help: "From a change's commit to its delivery (2xx answer).",
            buckets: [0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600, 86_400])
        requestDuration = registry.histogram(
            "siwa_webhook_request_duration_seconds", help: "One delivery attempt's HTTP round trip.",
            buckets: Histogram.requestBuckets)
        inFlight = registry.gauge("siwa_webhook_in_flight", help: "Deliveries this process is sending now.")
        oldestUndelivered = registry.gauge(
            "siwa_webhook_oldest_undelivered_seconds",
            help: "Age of the oldest change not yet delivered (0 when none; refreshed every few seconds).")
        undelivered = registry.gauge(
            "siwa_webhook_undelivered", help: "Changes queued for delivery and not delivered yet (discarded excluded).")
        discardedKept = registry.gauge(
            "siwa_webhook_discarded", help: "Discarded deliveries kept in the queue (each holds back its account).")
    }
}
