internal import CLibpq
internal import Logging

extension PostgresConnection {
    /// A read–decide–write transaction in two round trips instead of four: BEGIN travels with
    /// `opening`, `decide` runs with its rows (it may run statements of its own on `connection`),
    /// and the statement `decide` returns travels with COMMIT. Returns that statement's rows.
    ///
    /// Anything that fails rolls the transaction back and is rethrown; a COMMIT the server turns
    /// into ROLLBACK throws `queryFailed` with SQLSTATE 25P02, as `withTransaction` does. Both
    /// statements are prepared on this session at first use (parsed once).
    package func withTransaction(
        isolation: isolated (any Actor)? = #isolation, opening: PostgresQuery,
        closing decide: (PostgresConnection, PostgresRows) async throws -> PostgresQuery
    ) async throws -> PostgresRows {
        do {
            let opened: [PostgresRows]
            do {
                opened = try await onQueue { connection throws(PostgresError) in
                    try self.pipeline([Self.begin, opening], on: connection)
                }
            } catch let error as PostgresError where error.sqlState == "26000" || error.sqlState == "42P05" {
                // The session lost our prepared statements (see `pipeline`), so nothing ran but
                // BEGIN: once more, unnamed.
                try await simpleQuery("ROLLBACK")
                opened = try await onQueue { connection throws(PostgresError) in
                    try self.pipeline([Self.begin, opening], on: connection)
                }
            }
            let closing = try await decide(self, opened[1])
            let closed = try await onQueue { connection throws(PostgresError) in
                try self.pipeline([closing, Self.commit], on: connection)
            }
            return closed[0]
        } catch {
            do { try await simpleQuery("ROLLBACK") } catch {
                logger.debug("postgres rollback failed", metadata: ["db.error": "\(error)"])
            }
            throw error
        }
    }

    private static let begin: PostgresQuery = "BEGIN"
    private static let commit: PostgresQuery = "COMMIT"

    /// Sends `queries` in one flush (libpq pipeline mode, one Sync) and returns each one's rows.
    /// The first failure is thrown; the server skipped every statement after it. A COMMIT the server
    /// answered with ROLLBACK (the transaction had failed) is a failure (SQLSTATE 25P02). Meant for a few
    /// small statements: in blocking mode, a pipeline whose results outgrew the socket buffers
    /// while it was still being sent would wait on itself.
    func pipeline(_ queries: [PostgresQuery], on connection: OpaquePointer) throws(PostgresError) -> [PostgresRows] {
        // Prepared before the pipeline starts: PQprepare waits for its answer, which pipeline mode forbids.
        var names: [String?] = []
        for query in queries {
            names.append(handle.sendsUnnamedOnly ? nil : try preparedName(for: query, on: connection))
        }
        guard PQenterPipelineMode(connection) == 1 else {
            throw PostgresError(.queryFailed, message: libpqErrorMessage(connection), query: queries.first?.sql)
        }
        defer { _ = PQexitPipelineMode(connection) }  // fails only with results left, when the session is broken
        for (query, name) in zip(queries, names) {
            let sent = try query.binds.withLibpqArrays { (types, values, lengths, formats) throws(PostgresError) -> Int32 in
                if let name {
                    PQsendQueryPrepared(connection, name, Int32(query.binds.count), values, lengths, formats, 0)
                } else {
                    PQsendQueryParams(connection, query.sql, Int32(query.binds.count), types, values, lengths, formats, 0)
                }
            }
            guard sent == 1 else {
                throw PostgresError(.queryFailed, message: libpqErrorMessage(connection), query: query.sql)
            }
        }
        guard PQpipelineSync(connection) == 1 else {
            throw PostgresError(.queryFailed, message: libpqErrorMessage(connection), query: queries.last?.sql)
        }
        // Each statement: its result, then NULL (PIPELINE_ABORTED for those skipped after a
        // failure); then the Sync's own result. Every result is read, so the session is usable after.
        var outcomes: [Result<PostgresRows, PostgresError>] = []
        for query in queries {
            var outcome: OpaquePointer? = nil
            while let result = PQgetResult(connection) {
                if let outcome { PQclear(outcome) }
                outcome = result
            }
            outcomes.append(
                Result { () throws(PostgresError) in
                    let result = PostgresResult(taking: try Self.check(outcome, connection: connection, sql: query.sql))
                    if query.sql == "COMMIT", PQcmdStatus(result.pointer).map({ String(cString: $0) }) == "ROLLBACK" {
                        throw Self.commitRolledBack
                    }
                    return PostgresRows(result: result, affectedRows: Self.affectedRows(of: result.pointer))
                })
            if PQstatus(connection) != CONNECTION_OK { break }
        }
        while PQstatus(connection) == CONNECTION_OK, let result = PQgetResult(connection) {
            let status = PQresultStatus(result)
            PQclear(result)
            if status == PGRES_PIPELINE_SYNC { break }
        }
        var rows: [PostgresRows] = []
        for outcome in outcomes {
            switch outcome {
            case .success(let value): rows.append(value)
            case .failure(let error):
                // A statement the server skipped reports "pipeline aborted": the cause is an earlier one.
                if !handle.sendsUnnamedOnly, Self.sessionLostPreparedStatements(error) {
                    // The same fallback as `affectedRowsPrepared`: a proxy hands our statements to
                    // other sessions. This pipeline failed; the next one is sent unnamed.
                    sendUnnamedFromNowOn(after: error)
                }
                throw error
            }
        }
        guard rows.count == queries.count else {
            throw PostgresError(.connectionLost, message: libpqErrorMessage(connection), query: queries.last?.sql)
        }
        return rows
    }
}
