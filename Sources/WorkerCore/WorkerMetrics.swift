internal import JobQueue
import Metrics

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
    /// deploy/README.md's "What to alert on", as series (refreshed by the maintenance loop).
    let oldestReadySeconds: Gauge
    let oldestPendingRevokeSeconds: Gauge
    let pausedClients: Gauge
    /// 1 while the last maintenance pass reached the database, 0 after a failed one.
    let databaseReady: Gauge
    let inFlight: Gauge
    let batchFailures: Counter
    let batchSeconds: Histogram
    let batchJobs: Histogram
    let deferred: Counter
    let verifySeconds: Histogram
    let planRefreshes: Counter

    init(registry: MetricsRegistry) {
        var kinds: [JobKind: PerKind] = [:]
        // Names spelled out whole, so a search finds them (deploy-check matches the monitoring
        // files against the names in the sources).
        let families: [(String, String, String)] = [
            ("claimed", "siwa_worker_jobs_claimed_total", "Jobs claimed."),
            ("completed", "siwa_worker_jobs_completed_total", "Jobs completed."),
            ("retried", "siwa_worker_jobs_retried_total", "Failed attempts scheduled for retry."),
            ("discarded", "siwa_worker_jobs_discarded_total", "Jobs discarded (kept for an operator)."),
            ("snoozed", "siwa_worker_jobs_snoozed_total", "Jobs put back without counting a failure."),
        ]
        var made: [String: [JobKind: Counter]] = [:]
        for (name, metric, help) in families {
            for kind in JobKind.allCases {
                made[name, default: [:]][kind] = registry.counter(metric, help: help, labels: ["kind": kind.rawValue])
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
        oldestReadySeconds = registry.gauge(
            "siwa_worker_oldest_ready_job_seconds", help: "Age of the oldest job due and not yet claimed (0 when none).")
        oldestPendingRevokeSeconds = registry.gauge(
            "siwa_worker_oldest_pending_revoke_seconds",
            help: "Age of the oldest revoke (deletion) not yet done at Apple (0 when none).")
        pausedClients = registry.gauge(
            "siwa_worker_paused_clients", help: "Client IDs paused because Apple refused our credentials.")
        databaseReady = registry.gauge(
            "siwa_worker_database_ready", help: "1 when the last maintenance pass reached the database, else 0.")
        inFlight = registry.gauge("siwa_worker_jobs_in_flight", help: "Jobs this process is running now.")
        batchFailures = registry.counter(
            "siwa_worker_batch_errors_total", help: "Notification batches that failed as a whole (retried).")
        batchSeconds = registry.histogram(
            "siwa_worker_notification_batch_seconds",
            help: "One notification batch as the worker sees it: verifying held notifications, claim, effects and completion, and its commit.")
        verifySeconds = registry.histogram(
            "siwa_worker_notification_verify_seconds",
            help: "Inside one notification batch: verifying the held notifications it read (jws and columns), before their effects.")
        planRefreshes = registry.counter(
            "siwa_worker_plan_refreshes_total",
            help: "Times a notification session's kept plans were made again before a batch far larger than they were made for.")
        deferred = registry.counter(
            "siwa_worker_notifications_deferred_total",
            help: "Notification jobs a batch left queued because another transaction held their account (a later batch takes them).")
        batchJobs = registry.histogram(
            "siwa_worker_notification_batch_jobs", help: "Jobs claimed by one notification batch.",
            buckets: [0, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000])
    }

    subscript(kind: JobKind) -> PerKind { kinds[kind]! }

    func count(_ written: JobWritten, kind: JobKind) {
        let counters = self[kind]
        switch written.metric {
        case .completed: counters.completed.increment()
        case .retried: counters.retried.increment()
        case .discarded: counters.discarded.increment()
        case .snoozed: counters.snoozed.increment()
        }
    }
}
