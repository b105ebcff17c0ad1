package import Postgres

/// When a session's kept plans are made again, before a notification batch.
///
/// The batch's statements are planned once per session (`force_generic_plan` in
/// sql/functions/jobs.sql) with the table sizes of that moment, and PostgreSQL keeps those plans
/// until something invalidates them (an ANALYZE, a schema change). Planned while the queue was near
/// empty (a quiet hour after pruning, a table just analyzed empty), they are nested loops that walk
/// a whole table once per job, and stay so when a burst fills it: in deploy/bench/worker.sh's
/// steady run every batch of 250 took 3-9 s, until autovacuum's next ANALYZE a minute later, and
/// every effect of the run was 60 s late. So a session's plans are dropped (`DISCARD PLANS`: each is
/// planned again at its next use, on the tables as they are) when its batch is about to be far
/// larger than the smallest it has run since its plans were last made, which is when a plan made
/// for few rows may be running many; at most once per `interval` for each session, so batch sizes
/// swinging at a steady rate cost a replan (a few milliseconds) every few seconds at most.
package struct SessionPlans: Sendable {
    /// Batches smaller than this never refresh: a plan's shape does not matter for a few rows.
    package static let smallest = 32
    /// How many times larger than the smallest batch since the last refresh a batch must be.
    package static let growth = 4
    package static let interval = Duration.seconds(10)
    /// Sent on the batch's session, inside its transaction, before the batch's statement.
    package static let refreshSQL = "DISCARD PLANS"

    /// One PostgreSQL session: a reconnect is a new session with plans of its own.
    package struct Session: Hashable, Sendable {
        package var server: String
        package var backendPID: Int32
        package init(server: String, backendPID: Int32) {
            self.server = server
            self.backendPID = backendPID
        }
        package init(_ connection: PostgresConnection) {
            self.init(server: connection.server, backendPID: connection.backendPID)
        }
    }

    struct Plans {
        /// The smallest batch this session ran since its plans were last made (0 for a session
        /// never refreshed: its first plans were made on whatever the tables held).
        var smallestBatch = 0
        var refreshedAt: ContinuousClock.Instant?
    }

    private var sessions: [Session: Plans] = [:]
    /// Sessions closed long ago leave their entries; the map is emptied past this many.
    static let remembered = 256

    package init() {}

    /// Whether `session` should drop its plans before a batch of about `batch` jobs; when it says
    /// so, it counts the refresh as done at `now`.
    package mutating func shouldRefresh(_ session: Session, before batch: Int, at now: ContinuousClock.Instant) -> Bool {
        var plans = sessions[session] ?? Plans()
        guard batch >= Self.smallest, batch >= Self.growth * plans.smallestBatch else { return false }
        if let refreshedAt = plans.refreshedAt, now - refreshedAt < Self.interval { return false }
        plans.smallestBatch = batch
        plans.refreshedAt = now
        if sessions.count >= Self.remembered, sessions[session] == nil { sessions.removeAll() }
        sessions[session] = plans
        return true
    }

    /// After a batch that took `taken` jobs on `session`.
    package mutating func record(_ session: Session, taken: Int) {
        var plans = sessions[session] ?? Plans()
        plans.smallestBatch = min(plans.smallestBatch, taken)
        if sessions.count >= Self.remembered, sessions[session] == nil { sessions.removeAll() }
        sessions[session] = plans
    }
}
