package import JobQueue
package import Logging

// ┌──────────────────────────────────────────────────────────────────────────────────────────┐
// │ APPLE HANDLERS ARE REGISTERED HERE. The Apple engineer replaces this function's body with │
// │ the exchange / revoke / reconcile handlers (Sources/WorkerCore/Apple/). The worker calls  │
// │ it once at start; a kind with no handler is snoozed (60 s, logged loudly), never dropped. │
// └──────────────────────────────────────────────────────────────────────────────────────────┘
/// The handlers for the Apple-calling job kinds. Empty when `configuration.apple.callsEnabled` is false.
package func makeAppleHandlers(configuration: WorkerConfiguration, logger: Logger) -> [any JobHandler] {
    []
}
