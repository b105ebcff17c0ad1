package import Logging

/// Runs one kind of job. Handlers are idempotent: a job may run again after a crash or a lost
/// lease, and only the fenced completion decides which run counts.
package protocol JobHandler: Sendable {
    var kind: JobKind { get }
    func run(_ job: Job, logger: Logger) async -> JobResult
}
