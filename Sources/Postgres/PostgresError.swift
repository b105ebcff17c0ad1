/// The one error type of the `Postgres` module (shape of postgres-nio's `PSQLError`).
///
/// `description` is safe to log or return: it names the code, the SQLSTATE and, for errors raised by
/// libpq itself, libpq's message. Server messages (which can quote values, e.g. `invalid input syntax
/// for type bigint: "…"`), server detail (`Key (jti)=(…) already exists.`) and SQL text appear only in
/// `debugDescription`.
package struct PostgresError: Error, Sendable, CustomStringConvertible, CustomDebugStringConvertible {
    package struct Code: Sendable, Hashable, CustomStringConvertible {
        private enum Base: String, Sendable {
            case connectionFailed, connectionLost, connectionClosed, queryFailed, decodingFailed, timeout
            case invalidParameter, poolClosed, systemCallFailed
        }
        private let base: Base
        private init(_ base: Base) { self.base = base }

        /// The connection could not be established (connect or reset).
        package static let connectionFailed = Code(.connectionFailed)
        /// An established connection broke (server restart, network, admin shutdown).
        package static let connectionLost = Code(.connectionLost)
        /// The connection was closed by us (`close()`); it cannot be used any more.
        package static let connectionClosed = Code(.connectionClosed)
        /// The server rejected a statement; `sqlState` says why.
        package static let queryFailed = Code(.queryFailed)
        /// A column value could not be decoded into the requested Swift type.
        package static let decodingFailed = Code(.decodingFailed)
        /// A bounded wait ran out (pool lease).
        package static let timeout = Code(.timeout)
        /// A bound value cannot be sent (e.g. a `String` holding a NUL byte).
        package static let invalidParameter = Code(.invalidParameter)
        /// The pool was closed.
        package static let poolClosed = Code(.poolClosed)
        /// A system call (`poll`) failed.
        package static let systemCallFailed = Code(.systemCallFailed)

        package var description: String { base.rawValue }
    }

    package var code: Code
    /// Server primary message, or libpq's message for connection-level errors.
    package var message: String
    package var sqlState: String?
    /// Server detail (may contain values; debug only).
    package var detail: String?
    /// The SQL text (debug only; never contains bound values).
    package var query: String?
    /// The column a `decodingFailed` error is about.
    package var column: String?
    package var underlying: (any Error)?
    package var file: String
    package var line: Int

    package init(
        _ code: Code, message: String, sqlState: String? = nil, detail: String? = nil, query: String? = nil,
        column: String? = nil, underlying: (any Error)? = nil, file: String = #fileID, line: Int = #line
    ) {
        self.code = code
        self.message = message
        self.sqlState = sqlState
        self.detail = detail
        self.query = query
        self.column = column
        self.underlying = underlying
        self.file = file
        self.line = line
    }

    /// 23505 `unique_violation`.
    package var isUniqueViolation: Bool { sqlState == "23505" }

    /// The connection is (or may be) gone, or is to a server that cannot take writes: SQLSTATE class
    /// 08, 57P01 `admin_shutdown`, 57P02 `crash_shutdown`, 57P03 `cannot_connect_now`, 25006
    /// `read_only_sql_transaction` (a standby, e.g. behind a proxy that has not followed a failover
    /// yet), or a connection-level code. A new session may succeed where this one failed.
    package var isConnectionProblem: Bool {
        if code == .connectionFailed || code == .connectionLost || code == .connectionClosed { return true }
        guard let sqlState else { return false }
        return sqlState.hasPrefix("08") || sqlState == "57P01" || sqlState == "57P02" || sqlState == "57P03"
            || sqlState == "25006"
    }

    /// Codes whose `message` comes from libpq or from us and never quotes data.
    private var messageIsSafe: Bool {
        code != .queryFailed && code != .decodingFailed
    }

    package var description: String {
        var text = "PostgresError(\(code)"
        if let sqlState { text += ", sqlState: \(sqlState)" }
        if let column { text += ", column: \(column)" }
        if messageIsSafe { text += ", message: \(message)" }
        return text + ")"
    }

    package var debugDescription: String {
        var text = "PostgresError(code: \(code), message: \(message)"
        if let sqlState { text += ", sqlState: \(sqlState)" }
        if let column { text += ", column: \(column)" }
        if let detail { text += ", detail: \(detail)" }
        if let query { text += ", query: \(query)" }
        if let underlying { text += ", underlying: \(String(reflecting: underlying))" }
        return text + ", at: \(file):\(line))"
    }
}

extension Error {
    /// True for a `PostgresError` that means the connection is unusable (see `PostgresError.isConnectionProblem`).
    package var isPostgresConnectionProblem: Bool {
        (self as? PostgresError)?.isConnectionProblem ?? false
    }
}
