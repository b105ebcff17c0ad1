internal import CLibpq
internal import Dispatch
import Locking

#if canImport(Glibc)
    internal import Glibc
#endif

/// A statement's reply as it arrives: the result kept so far (a failure over an earlier success).
// @unchecked Sendable: used only inside the connection's `queue.sync`, by one statement's steps.
final class ReplyInProgress: @unchecked Sendable {
    private var outcome: OpaquePointer?
    /// The statement has gone out and its reply is not all in (the socket is this reply's).
    var sent = false

    /// Reads what the socket has and every result it completes. True once the last is in.
    func absorb(_ connection: OpaquePointer, sql: String) throws(PostgresError) -> Bool {
        guard PQconsumeInput(connection) == 1 else {
            throw PostgresError(.queryFailed, message: libpqErrorMessage(connection), query: sql)
        }
        while PQisBusy(connection) == 0 {
            guard let result = PQgetResult(connection) else { return true }
            if outcome == nil || !PostgresConnection.isSuccess(PQresultStatus(result)) {
                if let outcome { PQclear(outcome) }
                outcome = result
            } else {
                PQclear(result)
            }
        }
        return false
    }

    /// The statement's rows, once `finish` has made them.
    private(set) var rows: PostgresRows?

    /// Turns the result kept into `rows`, or throws the server's error.
    func finish(_ connection: OpaquePointer, sql: String) throws(PostgresError) {
        let taken = outcome
        outcome = nil
        let result = PostgresResult(taking: try PostgresConnection.check(taken, connection: connection, sql: sql))
        rows = PostgresRows(result: result, affectedRows: PostgresConnection.affectedRows(of: result.pointer))
    }

    deinit { if let outcome { PQclear(outcome) } }
}

extension PostgresConnection {
    /// `query`'s statement: sent here, its reply awaited without holding a thread.
    func rowsSentHere(_ query: PostgresQuery) async throws -> PostgresRows {
        let rows = try await bounded { operation in
            try await self.awaitReply(to: query.sql, operation: operation) { connection throws(PostgresError) in
                try query.binds.withLibpqArrays { (types, values, lengths, formats) throws(PostgresError) in
                    PQsendQueryParams(connection, query.sql, Int32(query.binds.count), types, values, lengths, formats, 0)
                }
            }
        }
        if let rows { return rows }
        // No watcher (no epoll set could be made): on the queue, as before it.
        return try await onQueue { connection throws(PostgresError) in try Self.rows(query, on: connection) }
    }

    /// `queryPrepared`'s statement: prepared on this session at first use, then run by name, each
    /// sent here and its answer awaited without holding a thread. A session that keeps no prepared
    /// statements (a transaction-pooling proxy) sends it unnamed, on the queue.
    func rowsPreparedSentHere(_ query: PostgresQuery) async throws -> PostgresRows {
        do {
            for _ in 0..<2 {
                if let rows = try await runPreparedSentHere(query) { return rows }
                guard try await prepareSentHere(query) else { break }
            }
        } catch let error as PostgresError where Self.sessionLostPreparedStatements(error) || error.sqlState == "0A000" {
            // Raised before the statement ran: the queue's path decides again, as for its own call.
            return try await onQueue { connection throws(PostgresError) in
                try self.rowsAfterPreparedFailed(error, query, on: connection)
            }
        }
        return try await onQueue { connection throws(PostgresError) in try self.rowsPrepared(query, on: connection) }
    }

    /// Runs `query` by the name it was prepared under on this session; nil when it has none.
    private func runPreparedSentHere(_ query: PostgresQuery) async throws -> PostgresRows? {
        try await bounded { operation in
            try await self.awaitReply(to: query.sql, operation: operation) { connection throws(PostgresError) in
                if self.handle.sendsUnnamedOnly { return nil }
                guard let name = self.handle.preparedStatements[PreparedKey(sql: query.sql, types: query.binds.types)] else {
                    return nil
                }
                return try query.binds.withLibpqArrays { (_, values, lengths, formats) throws(PostgresError) in
                    PQsendQueryPrepared(connection, name, Int32(query.binds.count), values, lengths, formats, 0)
                }
            }
        }
    }

    /// Prepares `query` on this session (parsed and planned once from now on); false when this
    /// session sends everything unnamed.
    private func prepareSentHere(_ query: PostgresQuery) async throws -> Bool {
        let key = PreparedKey(sql: query.sql, types: query.binds.types)
        var name = ""
        let prepared = try await bounded { operation in
            try await self.awaitReply(to: query.sql, operation: operation) { connection throws(PostgresError) in
                if self.handle.sendsUnnamedOnly { return nil }
                // Names are never reused within a session, also after one was dropped.
                self.handle.lastPreparedNumber += 1
                name = "siwa_\(self.handle.lastPreparedNumber)"
                return key.types.withUnsafeBufferPointer { types in
                    PQsendPrepare(connection, name, query.sql, Int32(types.count), types.baseAddress)
                }
            }
        }
        guard prepared != nil else { return false }
        queue.sync { handle.preparedStatements[key] = name }
        return true
    }

    /// Sends the statement with `send` on this thread (nil: it declined, nothing was sent), then
    /// waits for `ReplyWatcher` to say the socket has something and reads it, until the reply is
    /// complete; nil when nothing was sent. Each step runs through `queue.sync`, which runs it right
    /// here: it is this call's turn on the session (`bounded`), so the queue is idle. `close()`
    /// meanwhile is kept until the reply is in.
    ///
    /// The send itself is the one wait on this thread: libpq writes the message whole, which for a
    /// statement's few hundred bytes is a copy into the socket's buffer.
    private func awaitReply(
        to sql: String, operation: UInt64, send: (OpaquePointer) throws(PostgresError) -> Int32?
    ) async throws -> PostgresRows? {
        guard let watcher = ReplyWatcher.shared else { return nil }
        let reply = ReplyInProgress()
        while true {
            // Unsafe, not checked: each step resumes it exactly once, here or from the watcher, and a
            // checked one allocates a canary per wait.
            let stage = try await withUnsafeThrowingContinuation { continuation in
                do {
                    let stage = try queue.sync { () throws(PostgresError) -> ReplyStage? in
                        do throws(PostgresError) {
                            return try step(reply, sql: sql, operation: operation, send: send) { socket in
                                watcher.resumeWhenReadable(socket, continuation)
                            }
                        } catch {
                            settle(reply, operation: operation)
                            throw error
                        }
                    }
                    if let stage { continuation.resume(returning: stage) }
                } catch {
                    continuation.resume(throwing: error)
                }
            }
            switch stage {
            case .declined: return nil
            case .readable: watcher.passThrough()
            case .complete: return reply.rows
            }
        }
    }

    /// One step, on the queue: sends the statement, or reads what arrived; then either the reply is
    /// complete (`reply.rows`) or `watch` is to wake the task (nil).
    private func step(
        _ reply: ReplyInProgress, sql: String, operation: UInt64, send: (OpaquePointer) throws(PostgresError) -> Int32?,
        watch: (Int32) -> Int32
    ) throws(PostgresError) -> ReplyStage? {
        try runOnQueue(operation: nil) { connection throws(PostgresError) -> ReplyStage? in
            if !reply.sent {
                guard let outcome = try send(connection) else { return .declined }
                guard outcome == 1 else {
                    throw PostgresError(.queryFailed, message: libpqErrorMessage(connection), query: sql)
                }
                reply.sent = true
                handle.replyInFlight = true
                state.withLock { $0.running = operation }
            } else if try reply.absorb(connection, sql: sql) {
                settle(reply, operation: operation)
                try reply.finish(connection, sql: sql)
                return .complete
            }
            let failure = watch(PQsocket(connection))
            guard failure == 0 else {
                state.withLock { if $0.status == .ok { $0.status = .bad } }
                throw PostgresError(
                    .connectionLost, message: "cannot wait for the server's reply (errno \(failure))", query: sql)
            }
            return nil
        }
    }

    /// On the queue, once the reply is in or the statement failed: the statement no longer runs
    /// (no cancel request may reach the session for it), and a `close()` it held back happens now.
    private func settle(_ reply: ReplyInProgress, operation: UInt64) {
        guard reply.sent else { return }
        reply.sent = false
        state.withLock { if $0.running == operation { $0.running = nil } }
        handle.replyInFlight = false
        if handle.finishWhenReplied { handle.finish() }
    }
}
