internal import CLibpq
internal import Dispatch
package import Logging
import Locking

/// One libpq connection.
///
/// libpq allows one thread at a time per `PGconn`, so the connection owns a serial `DispatchQueue` and
/// touches the `PGconn` only through it (STYLE §5.3). The async calls hop onto the queue, whose
/// thread blocks in libpq, and resume a continuation; on a connection made `watchingReplies` (the
/// app API's), `query`, `queryPrepared` and `execute` instead send their statement from the calling
/// task's thread (`queue.sync`, which runs there: the queue is idle between calls) and suspend until
/// `ReplyWatcher` sees the reply arrive; the task then reads it where it resumes (`+Replies`). Either way the cooperative pool is never blocked, and async
/// callers of one connection take turns (`SessionTurns`). The `…Blocking` API runs its work on the
/// caller's thread through `queue.sync`; use it only from a dedicated thread that alone uses the
/// connection (the receiver's committers), never from the Swift concurrency pool. Which path a call
/// takes is the caller's choice of API, never the thread it happens to be on.
///
/// Cancelling the task of a running async call sends a libpq cancel request for that statement.
package final class PostgresConnection: Sendable {
    package enum Status: Sendable, Equatable {
        /// Connected, as far as the last call could tell.
        case ok
        /// The connection broke; `resetIfBroken()` reconnects it.
        case bad
        /// `close()` was called.
        case closed
    }

    package let logger: Logger
    let queue: DispatchQueue
    /// Run at the start of every session (connect and reset): `sessionSetup` and the limits.
    let setupSQL: String
    let handle: ConnectionHandle
    let state: Locked<State>
    /// Orders the queue's work before the awaiting task's reads where ThreadSanitizer can see it.
    let handOff = QueueHandOff()
    /// One async call at a time on the session.
    let turns = SessionTurns()
    /// `query`, `queryPrepared` and `execute` send from the calling task and await the reply on
    /// `ReplyWatcher` (`connect(…, watchingReplies: true)`); otherwise they wait on the queue's thread.
    let watchesReplies: Bool

    /// The bound on each statement of the calls made inside `$statementTimeout.withValue(...)`:
    /// when it runs out the statement is cancelled at the server and the call throws `timeout`.
    /// Kept by `DeadlineTimer` (an entry in one table, no task or timer per statement). Nil: no
    /// bound but the session's own (`SessionLimits`).
    @TaskLocal package static var statementTimeout: Duration?

    struct State {
        var status: Status = .ok
        var backendPID: Int32 = 0
        /// `host:port` of the server this session is on.
        var server = ""
        /// libpq cancel object for the current backend (thread-safe to use; freed here).
        var cancel: OpaquePointer?
        var running: UInt64?
        var nextOperation: UInt64 = 0
    }

    /// Session settings every connection gets, so text output is what the decoders expect.
    static let sessionSetup =
        "SET TimeZone TO 'UTC'; SET DateStyle TO 'ISO, MDY'; SET bytea_output TO 'hex'; "
        + "SET client_encoding TO 'UTF8'"

    /// Sets up the object on the caller's side; `open` then connects on `queue`. Doing both on the
    /// queue made ThreadSanitizer report the caller's first read of these fields: on Linux it does
    /// not see libdispatch's hand-off (swift-corelibs-libdispatch#655).
    private init(queue: DispatchQueue, limits: SessionLimits, watchesReplies: Bool = false, logger: Logger) {
        self.queue = queue
        self.watchesReplies = watchesReplies
        self.logger = logger
        self.setupSQL = Self.sessionSetup + limits.setupSQL
        self.handle = ConnectionHandle(logger: logger)
        self.state = Locked(State())
    }

    /// Runs on `queue`: opens the connection (blocking) and prepares the session.
    private func open(conninfo: String, applicationName: String) throws(PostgresError) {
        dispatchPrecondition(condition: .onQueue(queue))
        // Defaults first; keywords inside `conninfo` (expanded from dbname) override them. TCP
        // keepalives and a user timeout find a peer that vanished (a suspended VM, a dropped NAT
        // entry) in about 30 s instead of the kernel's two hours; unix sockets ignore them.
        let keywords = [
            "connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count",
            "tcp_user_timeout", "application_name", "dbname",
        ]
        let values = ["5", "1", "10", "5", "3", "30000", applicationName, conninfo]
        let pointer = withCStringArrays(keywords, values) { keywords, values in
            PQconnectdbParams(keywords, values, 1)
        }
        guard let pointer else {
            throw PostgresError(.connectionFailed, message: "libpq could not allocate a connection")
        }
        handle.pointer = pointer  // owned by handle from here on (PQfinish in its deinit)
        guard PQstatus(pointer) == CONNECTION_OK else {
            throw PostgresError(.connectionFailed, message: libpqErrorMessage(pointer))
        }
        try prepareSession(pointer)
        logger.debug("postgres connected", metadata: ["db.backend_pid": .int(Int(PQbackendPID(pointer)))])
    }

    deinit {
        state.withLock { state in
            if let cancel = state.cancel { PQfreeCancel(cancel) }
            state.cancel = nil
        }
    }

    /// Connects with a URI (`postgresql://user@host:port/db?options=…`) or `key=value` conninfo.
    /// `connect_timeout` defaults to 5 s and TCP keepalives are on unless the conninfo says otherwise.
    /// `watchingReplies`: for a request's hot path (the app API's pool), see `watchesReplies`.
    package static func connect(
        to conninfo: String, applicationName: String = "siwa", limits: SessionLimits = .none,
        watchingReplies: Bool = false, logger: Logger
    ) async throws -> PostgresConnection {
        let connection = PostgresConnection(
            queue: DispatchQueue(label: "siwa.postgres.connection"), limits: limits, watchesReplies: watchingReplies,
            logger: logger)
        try await connection.hop { () throws(PostgresError) in
            try connection.open(conninfo: conninfo, applicationName: applicationName)
        }
        return connection
    }

    /// Blocking `connect`, for a dedicated thread. Never call it from the concurrency pool.
    package static func connectBlocking(
        to conninfo: String, applicationName: String = "siwa", limits: SessionLimits = .none, logger: Logger
    ) throws -> PostgresConnection {
        let connection = PostgresConnection(
            queue: DispatchQueue(label: "siwa.postgres.connection"), limits: limits, logger: logger)
        try connection.queue.sync { try connection.open(conninfo: conninfo, applicationName: applicationName) }
        return connection
    }

    package var status: Status { state.withLock { $0.status } }
    package var isUsable: Bool { status == .ok }
    /// The server process id of this session (changes after a reset).
    package var backendPID: Int32 { state.withLock { $0.backendPID } }
    /// `host:port` of the server this session is on: which host of a multi-host URL accepted it.
    /// An address, never a credential, so it may be logged.
    package var server: String { state.withLock { $0.server } }

    /// Closes the connection after any call already queued. Later calls throw `connectionClosed`.
    package func close() {
        state.withLock { state in
            state.status = .closed
            if let cancel = state.cancel { PQfreeCancel(cancel) }
            state.cancel = nil
        }
        // A statement sent from its task (`awaitReply`) keeps the socket until its reply is in.
        queue.async { [handle] in
            if handle.replyInFlight { handle.finishWhenReplied = true } else { handle.finish() }
        }
    }

    // MARK: Queries (async)

    /// Runs one statement (extended protocol, one round trip) and returns its rows.
    package func query(_ query: PostgresQuery) async throws -> PostgresRows {
        guard watchesReplies else {
            return try await onQueue { connection throws(PostgresError) in try Self.rows(query, on: connection) }
        }
        return try await rowsSentHere(query)
    }

    /// `query(_:)` for a statement run again and again (a request's hot path): prepared on this
    /// session at first use, so the server parses, analyzes and plans it once per session, not
    /// on every call. Sent unnamed when the session keeps no prepared statements (a
    /// transaction-pooling proxy), as `executePreparedBlocking` does.
    package func queryPrepared(_ query: PostgresQuery) async throws -> PostgresRows {
        guard watchesReplies else {
            return try await onQueue { connection throws(PostgresError) in try self.rowsPrepared(query, on: connection) }
        }
        return try await rowsPreparedSentHere(query)
    }

    /// Runs one statement and returns the number of rows it affected.
    @discardableResult
    package func execute(_ query: PostgresQuery) async throws -> Int {
        guard watchesReplies else {
            return try await onQueue { connection throws(PostgresError) in try Self.affectedRows(query, on: connection) }
        }
        return try await rowsSentHere(query).affectedRows
    }

    /// Runs SQL text through the simple protocol: several statements allowed, no binds (migrations).
    package func simpleQuery(_ sql: String) async throws {
        try await onQueue { connection throws(PostgresError) in _ = try Self.simple(sql, on: connection) }
    }

    /// Runs `body` between BEGIN and COMMIT; ROLLBACK (and rethrow) if it throws. A COMMIT the server
    /// turns into ROLLBACK (the transaction had failed) throws `queryFailed` with SQLSTATE 25P02.
    package func withTransaction<T: Sendable>(
        isolation: isolated (any Actor)? = #isolation, _ body: (PostgresConnection) async throws -> T
    ) async throws -> T {
        try await simpleQuery("BEGIN")
        let value: T
        do {
            value = try await body(self)
        } catch {
            do { try await simpleQuery("ROLLBACK") } catch {
                logger.debug("postgres rollback failed", metadata: ["db.error": "\(error)"])
            }
            throw error
        }
        try await onQueue { connection throws(PostgresError) in try Self.commit(on: connection) }
        return value
    }

    // MARK: Queries (blocking; dedicated threads only)

    /// `query(_:)` on the caller's thread. Must not be called from the Swift concurrency pool.
    package func queryBlocking(_ query: PostgresQuery) throws -> PostgresRows {
        try blocking { connection throws(PostgresError) in try Self.rows(query, on: connection) }
    }

    /// `execute(_:)` on the caller's thread. Must not be called from the Swift concurrency pool.
    @discardableResult
    package func executeBlocking(_ query: PostgresQuery) throws -> Int {
        try blocking { connection throws(PostgresError) in try Self.affectedRows(query, on: connection) }
    }

    /// `executeBlocking(_:)` for a statement run again and again: it is prepared on this session at
    /// first use (parsed and planned once). `meanwhile` runs on the caller's thread once the
    /// statement is sent, while the server works on it (the caller's other work overlaps the round
    /// trip); it runs exactly once, also when nothing could be sent, and must not use this connection.
    @discardableResult
    package func executePreparedBlocking(_ query: PostgresQuery, meanwhile: () -> Void = {}) throws -> Int {
        try blocking { connection throws(PostgresError) in
            try affectedRowsPrepared(query, on: connection, meanwhile: meanwhile)
        }
    }

    /// `simpleQuery(_:)` on the caller's thread. Must not be called from the Swift concurrency pool.
    package func simpleQueryBlocking(_ sql: String) throws {
        try blocking { connection throws(PostgresError) in _ = try Self.simple(sql, on: connection) }
    }

    /// `withTransaction(_:)` on the caller's thread. Must not be called from the Swift concurrency pool.
    package func withTransactionBlocking<T>(_ body: (PostgresConnection) throws -> T) throws -> T {
        try simpleQueryBlocking("BEGIN")
        let value: T
        do {
            value = try body(self)
        } catch {
            try? simpleQueryBlocking("ROLLBACK")
            throw error
        }
        try blocking { connection throws(PostgresError) in try Self.commit(on: connection) }
        return value
    }

    // MARK: Recovery

    /// For long-lived dedicated connections: checks the socket without blocking and, if the server has
    /// gone (restart, admin shutdown), reconnects with the same parameters. Returns true if it reset.
    /// Throws `connectionFailed` while the server is still unreachable (status stays `.bad`).
    package func resetIfBroken() async throws -> Bool {
        try await onQueue { connection throws(PostgresError) in try self.resetIfBrokenOnQueue(connection) }
    }

    /// `resetIfBroken()` on the caller's thread. Must not be called from the Swift concurrency pool.
    package func resetIfBrokenBlocking() throws -> Bool {
        try blocking { connection throws(PostgresError) in try self.resetIfBrokenOnQueue(connection) }
    }

    /// Whether the session's socket sends TCP keepalives (false for a unix socket).
    package var sendsTCPKeepalives: Bool {
        get async {
            (try? await onQueue { connection throws(PostgresError) in Self.keepaliveEnabled(PQsocket(connection)) }) ?? false
        }
    }

    /// `checkHealth()` on the caller's thread, any thread: the probe never blocks, and `queue.sync`
    /// runs it right here when the queue is idle (a pooled connection's is, or is finishing the
    /// hand-off of its last call). What the pool does on each lease, without a hop.
    package func checkHealthHere() -> Bool {
        let alive = (try? blocking { connection throws(PostgresError) in Self.probe(connection) }) ?? false
        if !alive { state.withLock { $0.status = .bad } }
        return alive
    }

    /// Non-blocking liveness probe (poll with zero timeout, consume pending input). Updates `status`.
    package func checkHealth() async -> Bool {
        (try? await onQueue { connection throws(PostgresError) in
            let alive = Self.probe(connection)
            if !alive { self.state.withLock { $0.status = .bad } }
            return alive
        }) ?? false
    }
}
