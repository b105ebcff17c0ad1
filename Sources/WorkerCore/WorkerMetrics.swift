internal import JobQueue
internal import SiwaCore

/// The worker's series on `/metrics`.
struct WorkerMetrics: Sendable {
    struct PerKind: Sendable {
        let claimed: Counter
        let completed: Counter
        let retried: Counter
        let discarded: Counter
        let snoozed: Counter
    }

    let kinds: [JobKind: PerKind]
    let effectDelay: Histogram
    let queueDepth: Gauge
    let inFlight: Gauge
    let batchFailures: Counter
    let batchSeconds: Histogram
    let batchJobs: Histogram

    init(registry: MetricsRegistry) {
        var kinds: [JobKind: PerKind] = [:]
        let families: [(String, String)] = [
            ("claimed", "Jobs claimed."), ("completed", "Jobs completed."),
            ("retried", "Failed attempts scheduled for retry."), ("discarded", "Jobs discarded (kept for an operator)."),
            ("snoozed", "Jobs put back without counting a failure."),
        ]
        var made: [String: [JobKind: Counter]] = [:]
        for (name, help) in families {
            for kind in JobKind.allCases {
                made[name, default: [:]][kind] = registry.counter(
                    "siwa_worker_jobs_\(name)_total", help: help, labels: ["kind": kind.rawValue])
            }
        }
        for kind in JobKind.allCases {
            kinds[kind] = PerKind(
                claimed: made["claimed"]![kind]!, completed: made["completed"]![kind]!,
                retried: made["retried"]![kind]!, discarded: made["discarded"]![kind]!,
                snoozed: made["snoozed"]![kind]!)
        }
        self.kinds = kinds
        effectDelay = registry.histogram(
            "siwa_worker_effect_delay_seconds", help: "From a notification's received_at to its effect's commit.")
        queueDepth = registry.gauge("siwa_worker_queue_depth", help: "Jobs available and due (refreshed every few seconds).")
        inFlight = registry.gauge("siwa_worker_jobs_in_flight", help: "Jobs this process is running now.")
        batchFailures = registry.counter(
            "siwa_worker_batch_errors_total", help: "Notification batches that failed as a whole (retried).")
        batchSeconds = registry.histogram(
            "siwa_worker_notification_batch_seconds",
            help: "One notification batch as the worker sees it: claim, effects and completion in one statement, and its commit.")
        batchJobs = registry.histogram(
            "siwa_worker_notification_batch_jobs", help: "Jobs claimed by one notification batch.",
            buckets: [0, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000])
    }

    subscript(kind: JobKind) -> PerKind { kinds[kind]! }

    func count(_ action: JobAction, kind: JobKind) {
        let counters = self[kind]
        switch action.metric {
        case .completed: counters.completed.increment()
        case .retried: counters.retried.increment()
        case .discarded: counters.discarded.increment()
        case .snoozed: counters.snoozed.increment()
        }
    }
}
