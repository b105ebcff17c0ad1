/// Server-side bounds on every statement of a session, so no caller waits on the database without
/// end: a statement running longer than `statementTimeout` is cancelled by the server (SQLSTATE
/// 57014), a lock not granted within `lockTimeout` fails the statement (55P03).
package struct SessionLimits: Sendable, Equatable {
    package var statementTimeout: Duration?
    package var lockTimeout: Duration?

    package init(statementTimeout: Duration? = nil, lockTimeout: Duration? = nil) {
        self.statementTimeout = statementTimeout
        self.lockTimeout = lockTimeout
    }

    /// The server's defaults (for migrations and operator commands, which may legitimately run long).
    package static let none = SessionLimits()

    /// `SET` statements appended to the session setup (the same round trip).
    var setupSQL: String {
        var sql = ""
        if let statementTimeout { sql += "; SET statement_timeout TO \(Self.milliseconds(statementTimeout))" }
        if let lockTimeout { sql += "; SET lock_timeout TO \(Self.milliseconds(lockTimeout))" }
        return sql
    }

    /// Whole milliseconds, at least 1 (0 would mean "no limit" to the server).
    private static func milliseconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        return max(1, seconds * 1000 + attoseconds / 1_000_000_000_000_000)
    }
}
