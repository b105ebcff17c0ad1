internal import CLibpq
internal import Dispatch
internal import Logging
import Locking

#if canImport(Glibc)
    internal import Glibc
#elseif canImport(Darwin)
    internal import Darwin
#endif

/// Owns the `PGconn`.
// @unchecked Sendable: `pointer` is read and written only on the owning connection's serial queue
// (and in deinit, when nothing else can hold the handle).
final class ConnectionHandle: @unchecked Sendable {
    var pointer: OpaquePointer?
    /// Statements prepared on this session, by SQL text and parameter types; emptied whenever the
    /// session is new (connect, reset).
    var preparedStatements: [PreparedKey: String] = [:]
    /// The number in the last prepared statement's name: names are never reused within a session,
    /// also after one was dropped.
    var lastPreparedNumber = 0
    /// Set once the server loses or duplicates our prepared statements (a transaction-pooling
    /// proxy between us hands each statement to whichever session is free): from then on this
    /// connection sends every statement unnamed.
    var sendsUnnamedOnly = false
    /// A statement sent from its task awaits its reply (`awaitReply`); `close()` meanwhile only
    /// sets `finishWhenReplied`.
    var replyInFlight = false
    var finishWhenReplied = false
    /// Passed to libpq as the notice processor's context; lives as long as the PGconn.
    let notices: NoticeContext

    init(logger: Logger) { notices = NoticeContext(logger: logger) }

    func finish() {
        if let pointer { PQfinish(pointer) }
        pointer = nil
    }

    deinit { finish() }
}

struct PreparedKey: Hashable {
    var sql: String
    var types: [UInt32]
}

/// Routes server notices (`relation … already exists, skipping`) to the logger instead of stderr.
final class NoticeContext: Sendable {
    let logger: Logger
    init(logger: Logger) { self.logger = logger }

    static let processor: PQnoticeProcessor = { context, message in
        guard let context, let message else { return }
        let notices = Unmanaged<NoticeContext>.fromOpaque(context).takeUnretainedValue()
        var text = String(cString: message)
        while text.last?.isNewline == true { text.removeLast() }
        notices.logger.debug("postgres notice", metadata: ["db.notice": .string(text)])
    }
}

/// A `PGcancel` on its way into the state lock.
// @unchecked Sendable: libpq documents PQcancel as safe to call from any thread; the pointer is only
// used and freed under the connection's state lock.
struct CancelObject: @unchecked Sendable {
    let pointer: OpaquePointer?
    init(_ pointer: OpaquePointer?) { self.pointer = pointer }
}

extension PostgresConnection {
    /// Runs `work` on the queue and resumes the caller: the one place a statement blocks is the
    /// connection's own queue, never the calling task's thread. Cancelling the task sends a cancel
    /// request for the running statement, and so does `statementTimeout` running out (the call
    /// then throws `timeout`); either way the statement ends at the server and the call returns.
    func onQueue<T: Sendable>(
        _ work: @escaping @Sendable (OpaquePointer) throws(PostgresError) -> T
    ) async throws -> T {
        try await bounded { operation in
            try await self.hop { () throws(PostgresError) in try self.runOnQueue(operation: operation, work) }
        }
    }

    /// Runs `body` as statement `operation`, once it is this call's turn on the session
    /// (`SessionTurns`), under the call's bounds: cancelling the task, or
    /// `statementTimeout` running out, sends a cancel request for the statement while it is the one
    /// running (`state.running`), and the call then throws `timeout`.
    func bounded<T: Sendable>(_ body: (UInt64) async throws -> T) async throws -> T {
        // The bound starts once the session is this call's.
        await turns.take()
        defer { turns.pass() }
        let operation = state.withLock { state in
            state.nextOperation &+= 1
            return state.nextOperation
        }
        guard let timeout = Self.statementTimeout else {
            return try await withTaskCancellationHandler { try await body(operation) } onCancel: {
                self.cancelRunning(operation)
            }
        }
        let expired = Locked(false)
        let timer = DeadlineTimer.shared.schedule(after: timeout) { [self] in
            expired.withLock { $0 = true }
            // PQcancel connects to the server and waits for it: not on the timer's thread.
            DispatchQueue.global().async { self.cancelRunning(operation) }
        }
        do {
            let value = try await withTaskCancellationHandler { try await body(operation) } onCancel: {
                self.cancelRunning(operation)
            }
            DeadlineTimer.shared.cancel(timer)
            return value
        } catch {
            if !DeadlineTimer.shared.cancel(timer), expired.withLock({ $0 }) {
                throw PostgresError(.timeout, message: "the statement ran past its bound of \(timeout) and was cancelled")
            }
            throw error
        }
    }

    /// Runs `body` on the queue and hands its outcome to the awaiting task, through `handOff` so that
    /// ThreadSanitizer sees the order too.
    func hop<T: Sendable>(_ body: @escaping @Sendable () throws(PostgresError) -> T) async throws -> T {
        defer { handOff.receive() }
        return try await withCheckedThrowingContinuation { continuation in
            queue.async {
                let outcome = Result(catching: body)
                self.handOff.publish()
                continuation.resume(with: outcome)
            }
        }
    }

    /// Runs `work` on the caller's thread, serialized with the queue.
    func blocking<T>(operation: UInt64? = nil, _ work: (OpaquePointer) throws(PostgresError) -> T) throws -> T {
        dispatchPrecondition(condition: .notOnQueue(queue))
        return try queue.sync { () throws(PostgresError) -> T in try runOnQueue(operation: operation, work) }
    }

    /// The one place a `PGconn` is used. Marks the connection bad when libpq reports it broken and
    /// turns the error into `connectionLost` then.
    func runOnQueue<T>(operation: UInt64?, _ work: (OpaquePointer) throws(PostgresError) -> T) throws(PostgresError)
        -> T
    {
        // Work runs on the queue's thread or, for the `…Blocking` API, on a dedicated caller's
        // thread (`queue.sync`); the queue orders them, and passing through `handOff` at both ends
        // shows that order to ThreadSanitizer too.
        handOff.receive()
        defer { handOff.publish() }
        guard let connection = handle.pointer else {
            throw PostgresError(.connectionClosed, message: "the connection is closed")
        }
        if let operation { state.withLock { $0.running = operation } }
        defer { if operation != nil { state.withLock { $0.running = nil } } }
        do {
            return try work(connection)
        } catch {
            var error = error
            if PQstatus(connection) != CONNECTION_OK {
                state.withLock { if $0.status == .ok { $0.status = .bad } }
                if error.code == .queryFailed { error.code = .connectionLost }
                logger.debug(
                    "postgres connection lost",
                    metadata: ["db.sqlstate": .string(error.sqlState ?? ""), "db.error": .string(error.message)])
            } else if error.isConnectionProblem {
                // Still connected, but to a server that is shutting down or cannot write (a standby):
                // only a new session can reach the primary.
                state.withLock { if $0.status == .ok { $0.status = .bad } }
                logger.debug(
                    "postgres session needs a new connection", metadata: ["db.sqlstate": .string(error.sqlState ?? "")])
            }
            throw error
        }
    }

    /// Sends a cancel request if `operation` is the statement running now (under the lock, so it cannot
    /// hit a later statement).
    func cancelRunning(_ operation: UInt64) {
        state.withLock { state in
            guard state.running == operation, let cancel = state.cancel else { return }
            withUnsafeTemporaryAllocation(of: CChar.self, capacity: 256) { buffer in
                buffer.initialize(repeating: 0)
                if PQcancel(cancel, buffer.baseAddress, Int32(buffer.count)) == 0 {
                    let message = String(cString: buffer.baseAddress!)
                    logger.debug("postgres cancel request failed", metadata: ["db.error": .string(message)])
                }
            }
        }
    }

    /// Session settings and the cancel object; run after connect and after every reset.
    func prepareSession(_ connection: OpaquePointer) throws(PostgresError) {
        handle.preparedStatements.removeAll()
        PQsetNoticeProcessor(connection, NoticeContext.processor, Unmanaged.passUnretained(handle.notices).toOpaque())
        _ = try Self.simple(setupSQL, on: connection)
        let cancel = CancelObject(PQgetCancel(connection))
        let pid = PQbackendPID(connection)
        // With a multi-host URL this is the host that accepted the session (the primary, with
        // target_session_attrs=read-write).
        let server = (PQhost(connection).map { String(cString: $0) } ?? "") + ":"
            + (PQport(connection).map { String(cString: $0) } ?? "")
        state.withLock { state in
            if let old = state.cancel { PQfreeCancel(old) }
            state.cancel = cancel.pointer
            state.backendPID = pid
            state.server = server
            if state.status != .closed { state.status = .ok }
        }
    }

    /// True when the socket shows no sign of a dead server.
    static func probe(_ connection: OpaquePointer) -> Bool {
        guard PQstatus(connection) == CONNECTION_OK else { return false }
        let socket = PQsocket(connection)
        guard socket >= 0 else { return false }
        // Data or EOF waiting while idle: notifications, or the server saying goodbye (a FATAL
        // 57P01 message, which libpq hands to the notice processor, then EOF on the next read).
        for _ in 0..<8 {
            var descriptor = pollfd(fd: socket, events: Int16(POLLIN), revents: 0)
            guard poll(&descriptor, 1, 0) > 0 else { break }
            if PQconsumeInput(connection) == 0 { return false }
            // Parses what arrived (keeping notifications for waitForNotifications).
            _ = PQisBusy(connection)
            if PQstatus(connection) != CONNECTION_OK { return false }
        }
        return PQstatus(connection) == CONNECTION_OK
    }

    static func keepaliveEnabled(_ socket: Int32) -> Bool {
        var enabled: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        return getsockopt(socket, SOL_SOCKET, SO_KEEPALIVE, &enabled, &length) == 0 && enabled != 0
    }

    func resetIfBrokenOnQueue(_ connection: OpaquePointer) throws(PostgresError) -> Bool {
        if state.withLock({ $0.status == .ok }), Self.probe(connection) { return false }
        state.withLock { if $0.status == .ok { $0.status = .bad } }
        logger.debug("postgres connection reset")
        PQreset(connection)
        guard PQstatus(connection) == CONNECTION_OK else {
            throw PostgresError(.connectionFailed, message: libpqErrorMessage(connection))
        }
        try prepareSession(connection)
        return true
    }

    // MARK: Statement execution (on the queue)

    static func execute(_ query: PostgresQuery, on connection: OpaquePointer) throws(PostgresError) -> OpaquePointer {
        let result = try query.binds.withLibpqArrays { (types, values, lengths, formats) throws(PostgresError) in
            PQexecParams(connection, query.sql, Int32(query.binds.count), types, values, lengths, formats, 0)
        }
        return try check(result, connection: connection, sql: query.sql)
    }

    static func rows(_ query: PostgresQuery, on connection: OpaquePointer) throws(PostgresError) -> PostgresRows {
        let result = PostgresResult(taking: try execute(query, on: connection))
        return PostgresRows(result: result, affectedRows: affectedRows(of: result.pointer))
    }

    static func affectedRows(_ query: PostgresQuery, on connection: OpaquePointer) throws(PostgresError) -> Int {
        let result = try execute(query, on: connection)
        defer { PQclear(result) }
        return affectedRows(of: result)
    }

    /// Sends `query` as a statement prepared on this session (prepared on first use, so the
    /// server parses and plans it once), runs `meanwhile` on this thread while the server executes
    /// it, then waits for the outcome. `meanwhile` runs exactly once, even when nothing was sent.
    func affectedRowsPrepared(
        _ query: PostgresQuery, on connection: OpaquePointer, meanwhile: () -> Void
    ) throws(PostgresError) -> Int {
        var ranMeanwhile = false
        func runMeanwhileOnce() {
            if !ranMeanwhile {
                ranMeanwhile = true
                meanwhile()
            }
        }
        defer { runMeanwhileOnce() }
        if !handle.sendsUnnamedOnly {
            do throws(PostgresError) {
                let name = try preparedName(for: query, on: connection)
                return try Self.affectedRows(query, on: connection, afterSending: runMeanwhileOnce) {
                    values, lengths, formats in
                    PQsendQueryPrepared(connection, name, Int32(query.binds.count), values, lengths, formats, 0)
                }
            } catch where Self.sessionLostPreparedStatements(error) {
                // Neither error ran the statement, so sending it unnamed now runs it once.
                sendUnnamedFromNowOn(after: error)
            }
        }
        return try Self.affectedRows(query, on: connection, afterSending: runMeanwhileOnce) { values, lengths, formats in
            PQsendQueryParams(
                connection, query.sql, Int32(query.binds.count), query.binds.types, values, lengths, formats, 0)
        }
    }

    /// `rows(_:on:)` through a statement prepared on this session (see `queryPrepared`). A plan
    /// the server can no longer use as prepared (a function's result type changed under it by a
    /// migration: SQLSTATE 0A000, raised before anything ran) is dropped and the call sent
    /// unnamed; the next call prepares it anew.
    func rowsPrepared(_ query: PostgresQuery, on connection: OpaquePointer) throws(PostgresError) -> PostgresRows {
        if !handle.sendsUnnamedOnly {
            do throws(PostgresError) {
                let name = try preparedName(for: query, on: connection)
                let result = try query.binds.withLibpqArrays { (_, values, lengths, formats) throws(PostgresError) in
                    PQexecPrepared(connection, name, Int32(query.binds.count), values, lengths, formats, 0)
                }
                let checked = PostgresResult(taking: try Self.check(result, connection: connection, sql: query.sql))
                return PostgresRows(result: checked, affectedRows: Self.affectedRows(of: checked.pointer))
            } catch where Self.sessionLostPreparedStatements(error) || error.sqlState == "0A000" {
                return try rowsAfterPreparedFailed(error, query, on: connection)
            }
        }
        return try Self.rows(query, on: connection)
    }

    /// After `query` as a prepared statement failed with an error raised before it ran: a session
    /// that lost our prepared statements gets every statement unnamed from now on; a plan the
    /// server can no longer use as prepared is dropped (the next call prepares it anew). Either
    /// way it is sent unnamed now, except inside a transaction the error has already failed.
    func rowsAfterPreparedFailed(_ error: PostgresError, _ query: PostgresQuery, on connection: OpaquePointer)
        throws(PostgresError) -> PostgresRows
    {
        if Self.sessionLostPreparedStatements(error) {
            sendUnnamedFromNowOn(after: error)
        } else {
            let key = PreparedKey(sql: query.sql, types: query.binds.types)
            if let name = handle.preparedStatements.removeValue(forKey: key) {
                _ = try? Self.simple("DEALLOCATE \(name)", on: connection)
            }
            // Outside a transaction nothing was rolled back with it: sending it again runs it once.
            guard PQtransactionStatus(connection) == PQTRANS_IDLE else { throw error }
        }
        return try Self.rows(query, on: connection)
    }

    /// Sends with `send`, calls `afterSending`, then collects the statement's outcome.
    private static func affectedRows(
        _ query: PostgresQuery, on connection: OpaquePointer, afterSending: () -> Void,
        send: (
            _ values: UnsafePointer<UnsafePointer<CChar>?>?, _ lengths: UnsafePointer<Int32>?,
            _ formats: UnsafePointer<Int32>?
        ) -> Int32
    ) throws(PostgresError) -> Int {
        let sent = try query.binds.withLibpqArrays { (_, values, lengths, formats) throws(PostgresError) in
            send(values, lengths, formats)
        }
        guard sent == 1 else {
            throw PostgresError(.queryFailed, message: libpqErrorMessage(connection), query: query.sql)
        }
        afterSending()
        // One statement gives one result, then NULL; a failure is kept over an earlier success.
        var outcome: OpaquePointer? = nil
        while let result = PQgetResult(connection) {
            if outcome == nil || !isSuccess(PQresultStatus(result)) {
                if let outcome { PQclear(outcome) }
                outcome = result
            } else {
                PQclear(result)
            }
        }
        let result = try check(outcome, connection: connection, sql: query.sql)
        defer { PQclear(result) }
        return affectedRows(of: result)
    }

    /// The errors of a session that does not keep our prepared statements (a transaction-pooling
    /// proxy hands each statement to whichever session is free): none of them ran the statement.
    static func sessionLostPreparedStatements(_ error: PostgresError) -> Bool {
        error.sqlState == "26000" || error.sqlState == "42P05"
    }

    /// After such an error: this connection sends every statement unnamed from now on.
    func sendUnnamedFromNowOn(after error: PostgresError) {
        handle.sendsUnnamedOnly = true
        handle.preparedStatements.removeAll()
        logger.info(
            "postgres prepared statements do not persist on this connection (a transaction-pooling proxy?); sending statements unnamed",
            metadata: ["db.sqlstate": .string(error.sqlState ?? "")])
    }

    func preparedName(for query: PostgresQuery, on connection: OpaquePointer) throws(PostgresError) -> String {
        let key = PreparedKey(sql: query.sql, types: query.binds.types)
        if let name = handle.preparedStatements[key] { return name }
        handle.lastPreparedNumber += 1
        let name = "siwa_\(handle.lastPreparedNumber)"
        let result = key.types.withUnsafeBufferPointer { types in
            PQprepare(connection, name, query.sql, Int32(types.count), types.baseAddress)
        }
        PQclear(try Self.check(result, connection: connection, sql: query.sql))
        handle.preparedStatements[key] = name
        return name
    }

    /// Simple protocol; returns the command tag of the last statement.
    static func simple(_ sql: String, on connection: OpaquePointer) throws(PostgresError) -> String {
        let result = try check(PQexec(connection, sql), connection: connection, sql: sql)
        defer { PQclear(result) }
        return PQcmdStatus(result).map { String(cString: $0) } ?? ""
    }

    static func commit(on connection: OpaquePointer) throws(PostgresError) {
        if try simple("COMMIT", on: connection) == "ROLLBACK" { throw commitRolledBack }
    }

    static var commitRolledBack: PostgresError {
        PostgresError(
            .queryFailed, message: "the transaction had failed; COMMIT rolled it back", sqlState: "25P02", query: "COMMIT")
    }

    static func isSuccess(_ status: ExecStatusType) -> Bool {
        status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK || status == PGRES_EMPTY_QUERY
    }

    static func affectedRows(of result: OpaquePointer) -> Int {
        guard let text = PQcmdTuples(result), text.pointee != 0 else { return 0 }
        return Int(String(cString: text)) ?? 0
    }

    /// Returns `result` if it is a success; otherwise frees it and throws the server's error.
    static func check(_ result: OpaquePointer?, connection: OpaquePointer, sql: String) throws(PostgresError)
        -> OpaquePointer
    {
        guard let result else {
            throw PostgresError(.queryFailed, message: libpqErrorMessage(connection), query: sql)
        }
        let status = PQresultStatus(result)
        if isSuccess(status) { return result }
        defer { PQclear(result) }
        if status == PGRES_COPY_IN || status == PGRES_COPY_OUT || status == PGRES_COPY_BOTH {
            throw PostgresError(.queryFailed, message: "COPY is not supported by this wrapper", query: sql)
        }
        func field(_ code: Int32) -> String? {
            PQresultErrorField(result, code).map { String(cString: $0) }
        }
        let message =
            field(CLibpq_PG_DIAG_MESSAGE_PRIMARY)
            ?? PQresultErrorMessage(result).map { trimmed(String(cString: $0)) } ?? "unknown error"
        throw PostgresError(
            .queryFailed, message: message, sqlState: field(CLibpq_PG_DIAG_SQLSTATE),
            detail: field(CLibpq_PG_DIAG_MESSAGE_DETAIL), query: sql)
    }
}

func libpqErrorMessage(_ connection: OpaquePointer) -> String {
    PQerrorMessage(connection).map { trimmed(String(cString: $0)) } ?? "unknown libpq error"
}

private func trimmed(_ text: String) -> String {
    var text = text
    while text.last?.isWhitespace == true { text.removeLast() }
    return text
}

/// NULL-terminated `const char *const *` arrays for `PQconnectdbParams`.
func withCStringArrays<R>(
    _ first: [String], _ second: [String],
    _ body: (UnsafePointer<UnsafePointer<CChar>?>, UnsafePointer<UnsafePointer<CChar>?>) -> R
) -> R {
    let firstCopies = first.map { strdup($0) }
    let secondCopies = second.map { strdup($0) }
    defer {
        firstCopies.forEach { free($0) }
        secondCopies.forEach { free($0) }
    }
    let firstPointers = firstCopies.map { UnsafePointer($0) } + [nil]
    let secondPointers = secondCopies.map { UnsafePointer($0) } + [nil]
    return firstPointers.withUnsafeBufferPointer { firstBuffer in
        secondPointers.withUnsafeBufferPointer { secondBuffer in
            body(firstBuffer.baseAddress!, secondBuffer.baseAddress!)
        }
    }
}
