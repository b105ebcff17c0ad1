package import Metrics

/// Counters for the Apple calls, registered once per process.
package struct AppleMetrics: Sendable {
    package var configurationFaults: Counter
    package var linked: Counter
    package var linkFailed: Counter
    package var deleted: Counter
    package var consentRevoked: Counter
    package var retryableFailures: Counter
    package var rateLimited: Counter

    package init(registry: MetricsRegistry) {
        configurationFaults = registry.counter(
            "siwa_apple_configuration_faults_total",
            help: "Apple answered invalid_client/unauthorized_client: check SIWA_TEAM_ID, SIWA_KEY_ID, the .p8 and client IDs")
        linked = registry.counter("siwa_apple_links_total", help: "Code exchanges that linked an account", labels: ["result": "linked"])
        linkFailed = registry.counter("siwa_apple_links_total", help: "Code exchanges that linked an account", labels: ["result": "failed"])
        deleted = registry.counter("siwa_apple_revokes_total", help: "Revokes that completed a deletion")
        consentRevoked = registry.counter(
            "siwa_apple_reconcile_consent_revoked_total", help: "Accounts found revoked by reconciliation")
        retryableFailures = registry.counter(
            "siwa_apple_call_failures_total", help: "Apple calls that failed and will be retried", labels: ["class": "retryable"])
        rateLimited = registry.counter(
            "siwa_apple_call_failures_total", help: "Apple calls that failed and will be retried", labels: ["class": "rate_limited"])
    }
}
