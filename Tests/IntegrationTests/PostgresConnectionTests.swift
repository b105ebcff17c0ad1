import Foundation
import LocalPostgres
import Locking
import Logging
import Postgres
import TestTiming
import Testing

@Suite("PostgresConnection against a real server")
struct PostgresConnectionTests {
    @Test func everyBoundTypeRoundTrips() async throws {
        try await withTestSchema { schema in
            let connection = try await schema.connect()
            defer { connection.close() }
            try await connection.simpleQuery(
                """
                CREATE TABLE everything (
                    id bigint PRIMARY KEY, s text, i bigint, i32 integer, b boolean, d double precision,
                    t timestamptz, bytes bytea, j jsonb
                )
                """)
            let text = "héllo 👋 — 日本語 'quoted' \"double\" \\ back"
            let when = Date(timeIntervalSince1970: 1_795_970_684.123456)
            let bytes: [UInt8] = [0, 1, 0, 255, 0, 0x5c, 0x78]
            let inserted = try await connection.execute(
                """
                INSERT INTO everything (id, s, i, i32, b, d, t, bytes, j)
                VALUES (1, \(text), \(Int64.min), \(Int32.max), \(true), \(-1.5e-7), \(when), \(bytes), \("{\"a\": 1}"))
                """)
            #expect(inserted == 1)
            let noString: String? = nil
            let noInt: Int? = nil
            let noInt32: Int32? = nil
            let noBool: Bool? = nil
            let noDouble: Double? = nil
            let noDate: Date? = nil
            let noBytes: [UInt8]? = nil
            try await connection.execute(
                """
                INSERT INTO everything (id, s, i, i32, b, d, t, bytes, j)
                VALUES (2, \(noString), \(noInt), \(noInt32), \(noBool), \(noDouble), \(noDate), \(noBytes), \(noString))
                """)
            try await connection.execute("INSERT INTO everything (id, s, bytes, d) VALUES (3, '', '', 'Infinity')")

            let rows = try await connection.query("SELECT * FROM everything ORDER BY id")
            #expect(rows.count == 3)
            #expect(rows.columns.first == "id")
            let row = rows[0]
            #expect(try row.decode(Int.self, column: "id") == 1)
            #expect(try row.decode(String.self, column: "s") == text)
            #expect(try row.decode(Int64.self, column: "i") == Int64.min)
            #expect(try row.decode(Int32.self, column: "i32") == Int32.max)
            #expect(try row.decode(Bool.self, column: "b") == true)
            #expect(try row.decode(Double.self, column: "d") == -1.5e-7)
            let decoded = try row.decode(Date.self, column: "t")
            #expect(abs(decoded.timeIntervalSince1970 - when.timeIntervalSince1970) < 0.000_001)
            #expect(try row.decode([UInt8].self, column: "bytes") == bytes)
            #expect(try row.decode(String.self, column: "j") == "{\"a\": 1}")
            #expect(try row.decode(String.self, at: 1) == text)

            let nulls = rows[1]
            for column in ["s", "j"] { #expect(try nulls.decode(String?.self, column: column) == nil) }
            #expect(try nulls.decode(Int64?.self, column: "i") == nil)
            #expect(try nulls.decode(Int32?.self, column: "i32") == nil)
            #expect(try nulls.decode(Bool?.self, column: "b") == nil)
            #expect(try nulls.decode(Double?.self, column: "d") == nil)
            #expect(try nulls.decode(Date?.self, column: "t") == nil)
            #expect(try nulls.decode([UInt8]?.self, column: "bytes") == nil)
            #expect(try nulls.isNull(column: "s"))
            let error = #expect(throws: PostgresError.self) { try nulls.decode(String.self, column: "s") }
            #expect(error?.code == .decodingFailed)
            #expect(error?.column == "s")

            let empty = rows[2]
            #expect(try empty.decode(String.self, column: "s") == "")
            #expect(try empty.decode([UInt8].self, column: "bytes") == [])
            #expect(try empty.decode(Double.self, column: "d") == .infinity)

            // Server-side formatting of a date the server computed, in UTC.
            let epoch = try await connection.query("SELECT timestamptz '2000-01-01 00:00:00+00' AS t, now() AS n")
            #expect(try epoch[0].decode(Date.self, column: "t") == Date(timeIntervalSince1970: 946_684_800))
            #expect(abs(try epoch[0].decode(Date.self, column: "n").timeIntervalSinceNow) < 60)
        }
    }

    @Test func arraysRoundTripThroughTheServer() async throws {
        try await withTestSchema { schema in
            let connection = try await schema.connect()
            defer { connection.close() }
            let strings = ["plain", "a,b", "q\"uote", "back\\slash", "", "NULL", "{braces}", " space ", "ünï"]
            let rows = try await connection.query(
                "SELECT value, ordinality FROM unnest(\(strings)) WITH ORDINALITY AS u(value, ordinality) ORDER BY ordinality")
            #expect(try rows.map { try $0.decode(String.self, column: "value") } == strings)

            let numbers: [Int64] = [Int64.min, -1, 0, 42, Int64.max]
            let sums = try await connection.query("SELECT array_length(\(numbers), 1) AS n, (\(numbers))[5] AS last")
            #expect(try sums[0].decode(Int.self, column: "n") == 5)
            #expect(try sums[0].decode(Int64.self, column: "last") == Int64.max)

            let none = try await connection.query("SELECT cardinality(\([String]())) AS n, cardinality(\([Int64]())) AS m")
            #expect(try none[0].decode(Int.self, column: "n") == 0)
            #expect(try none[0].decode(Int.self, column: "m") == 0)

            let withNUL = await #expect(throws: PostgresError.self) {
                try await connection.query("SELECT \(["fine", "nul\u{0}byte"])")
            }
            #expect(withNUL?.code == .invalidParameter)
        }
    }

    @Test func injectionLookingStringsStayData() async throws {
        try await withTestSchema { schema in
            let connection = try await schema.connect()
            defer { connection.close() }
            try await connection.simpleQuery("CREATE TABLE notes (body text NOT NULL)")
            let nasty = ["'); DROP TABLE notes; --", "$1", "\\x00", "' OR '1'='1", "\"; SELECT pg_sleep(10); --"]
            for body in nasty { try await connection.execute("INSERT INTO notes (body) VALUES (\(body))") }
            let rows = try await connection.query("SELECT body FROM notes WHERE body = ANY(\(nasty))")
            #expect(rows.count == nasty.count)
            let matched = try await connection.query("SELECT count(*) AS n FROM notes WHERE body = \("' OR '1'='1")")
            #expect(try matched[0].decode(Int.self, column: "n") == 1)
        }
    }

    @Test func errorsCarrySQLState() async throws {
        try await withTestSchema { schema in
            let connection = try await schema.connect()
            defer { connection.close() }
            try await connection.simpleQuery("CREATE TABLE tokens (jti text PRIMARY KEY)")
            try await connection.execute("INSERT INTO tokens VALUES (\("secret-jti"))")
            let duplicate = await #expect(throws: PostgresError.self) {
                try await connection.execute("INSERT INTO tokens VALUES (\("secret-jti"))")
            }
            #expect(duplicate?.sqlState == "23505")
            #expect(duplicate?.isUniqueViolation == true)
            #expect(duplicate?.isConnectionProblem == false)
            #expect(duplicate?.code == .queryFailed)
            #expect(duplicate.map { !"\($0)".contains("secret-jti") && !"\($0)".contains("INSERT") } == true)
            #expect(duplicate.map { String(reflecting: $0).contains("INSERT INTO tokens") } == true)

            let missing = await #expect(throws: PostgresError.self) {
                try await connection.query("SELECT * FROM no_such_table")
            }
            #expect(missing?.sqlState == "42P01")
            #expect(missing?.isUniqueViolation == false)

            // The connection is still usable after errors.
            #expect(connection.isUsable)
            #expect(try await connection.query("SELECT 1 AS one")[0].decode(Int.self, column: "one") == 1)

            let nul = await #expect(throws: PostgresError.self) {
                try await connection.execute("INSERT INTO tokens VALUES (\("a\u{0}b"))")
            }
            #expect(nul?.code == .invalidParameter)
        }
    }

    /// No wait on the server is unbounded: every connection sends TCP keepalives (a peer that
    /// vanished is noticed), and `SessionLimits` bound statements and lock waits, also after a reset.
    @Test func keepalivesAndSessionLimitsBoundEveryWait() async throws {
        try await withTestSchema { schema in
            let plain = try await schema.connect()
            defer { plain.close() }
            #expect(await plain.sendsTCPKeepalives)

            let limited = try await PostgresConnection.connect(
                to: schema.conninfo, limits: SessionLimits(statementTimeout: .milliseconds(300), lockTimeout: .milliseconds(200)),
                logger: TestDatabase.logger)
            defer { limited.close() }
            #expect(await limited.sendsTCPKeepalives)
            #expect(try await limited.query("SHOW lock_timeout")[0].decode(String.self, at: 0) == "200ms")
            let slow = await #expect(throws: PostgresError.self) { try await limited.query("SELECT pg_sleep(30)") }
            #expect(slow?.sqlState == "57014")

            // A lock another session holds: 55P03 after lock_timeout, not a wait without end.
            try await plain.simpleQuery("CREATE TABLE held (id int)")
            try await plain.simpleQuery("BEGIN; LOCK TABLE held IN ACCESS EXCLUSIVE MODE")
            let locked = await #expect(throws: PostgresError.self) { try await limited.query("SELECT id FROM held") }
            #expect(locked?.sqlState == "55P03")
            try await plain.simpleQuery("ROLLBACK")

            // The limits survive a reset (a new backend session).
            _ = try await plain.query("SELECT pg_terminate_backend(\(limited.backendPID))")
            try await waitUntil("the terminated session is reset", timeout: .seconds(10)) {
                (try? await limited.resetIfBroken()) ?? false
            }
            #expect(try await limited.query("SHOW statement_timeout")[0].decode(String.self, at: 0) == "300ms")
        }
    }

    @Test func transactionsCommitOrRollBack() async throws {
        struct Boom: Error {}
        try await withTestSchema { schema in
            let connection = try await schema.connect()
            defer { connection.close() }
            try await connection.simpleQuery("CREATE TABLE ledger (n int)")
            await #expect(throws: Boom.self) {
                try await connection.withTransaction { transaction in
                    try await transaction.execute("INSERT INTO ledger VALUES (\(1))")
                    throw Boom()
                }
            }
            let kept = try await connection.withTransaction { transaction in
                try await transaction.execute("INSERT INTO ledger VALUES (\(2))")
            }
            #expect(kept == 1)
            // A statement error swallowed inside the body still fails the COMMIT.
            let failed = await #expect(throws: PostgresError.self) {
                try await connection.withTransaction { transaction in
                    try await transaction.execute("INSERT INTO ledger VALUES (\(3))")
                    _ = try? await transaction.query("SELECT * FROM missing")
                }
            }
            #expect(failed?.sqlState == "25P02")
            let rows = try await connection.query("SELECT n FROM ledger")
            #expect(try rows.map { try $0.decode(Int.self, column: "n") } == [2])
        }
    }

    /// The notification batch's transaction: BEGIN travels with the read, the write with COMMIT.
    /// Whatever fails (the read, the caller's decision, the write, the COMMIT itself) leaves nothing
    /// written and the session ready for the next transaction.
    @Test func twoRoundTripTransactionsCommitOrRollBack() async throws {
        struct Boom: Error {}
        try await withTestSchema { schema in
            let connection = try await schema.connect()
            defer { connection.close() }
            try await connection.simpleQuery(
                "CREATE TABLE ledger (n int PRIMARY KEY); INSERT INTO ledger VALUES (1); "
                    + "CREATE TABLE once (n int UNIQUE DEFERRABLE INITIALLY DEFERRED)")
            func ledger() async throws -> [Int] {
                try await connection.query("SELECT n FROM ledger ORDER BY n").map { try $0.decode(Int.self, column: "n") }
            }
            let written = try await connection.withTransaction(opening: "SELECT max(n) AS top FROM ledger") {
                transaction, opened in
                let top = try opened[0].decode(Int.self, column: "top")
                try await transaction.execute("INSERT INTO ledger VALUES (\(top + 10))")  // a statement of its own between
                return "INSERT INTO ledger VALUES (\(top + 1)) RETURNING n"
            }
            #expect(try written.map { try $0.decode(Int.self, column: "n") } == [2])
            #expect(try await ledger() == [1, 2, 11])

            let duplicate = await #expect(throws: PostgresError.self) {
                try await connection.withTransaction(opening: "SELECT 1") { transaction, _ in
                    try await transaction.execute("INSERT INTO ledger VALUES (\(20))")
                    return "INSERT INTO ledger VALUES (\(1))"
                }
            }
            #expect(duplicate?.sqlState == "23505")
            await #expect(throws: Boom.self) {
                try await connection.withTransaction(opening: "INSERT INTO ledger VALUES (\(30))") { _, _ in throw Boom() }
            }
            var decided = false
            let missing = await #expect(throws: PostgresError.self) {
                try await connection.withTransaction(opening: "SELECT * FROM missing") { _, _ in
                    decided = true
                    return "INSERT INTO ledger VALUES (\(40))"
                }
            }
            #expect(missing?.sqlState == "42P01" && !decided)
            // Checked only at COMMIT: the write went through, the COMMIT fails, nothing stays.
            let atCommit = await #expect(throws: PostgresError.self) {
                try await connection.withTransaction(opening: "INSERT INTO ledger VALUES (\(50))") { _, _ in
                    "INSERT INTO once VALUES (\(1)), (\(1))"
                }
            }
            #expect(atCommit?.sqlState == "23505")
            #expect(try await ledger() == [1, 2, 11])
            #expect(try await connection.int("SELECT count(*) FROM once") == 0)

            // Prepared once a session; a session that lost them (a pooling proxy) still commits once.
            #expect(try await connection.int("SELECT count(*) FROM pg_prepared_statements") > 0)
            try await connection.simpleQuery("DEALLOCATE ALL")
            _ = try await connection.withTransaction(opening: "SELECT max(n) AS top FROM ledger") { _, opened in
                "INSERT INTO ledger VALUES (\(try opened[0].decode(Int.self, column: "top") + 1))"
            }
            #expect(try await ledger() == [1, 2, 11, 12])
            #expect(try await connection.int("SELECT count(*) FROM pg_prepared_statements") == 0)
        }
    }

    @Test func skipLockedSplitsRowsBetweenConnections() async throws {
        try await withTestSchema { schema in
            let first = try await schema.connect()
            let second = try await schema.connect()
            defer {
                first.close()
                second.close()
            }
            try await first.simpleQuery("CREATE TABLE jobs (id bigint PRIMARY KEY); INSERT INTO jobs SELECT generate_series(1, 5)")
            let fetch: PostgresQuery = "SELECT id FROM jobs ORDER BY id LIMIT \(2) FOR UPDATE SKIP LOCKED"
            let (mine, theirs) = try await first.withTransaction { firstTransaction in
                let mine = try await firstTransaction.query(fetch).map { try $0.decode(Int64.self, column: "id") }
                let theirs = try await second.withTransaction { secondTransaction in
                    try await secondTransaction.query(fetch).map { try $0.decode(Int64.self, column: "id") }
                }
                return (mine, theirs)
            }
            #expect(mine == [1, 2])
            #expect(theirs == [3, 4])
        }
    }

    @Test func listenNotifyDeliversWithinTimeout() async throws {
        try await withTestSchema { schema in
            let listener = try await schema.connect()
            let sender = try await schema.connect()
            defer {
                listener.close()
                sender.close()
            }
            try await listener.listen("jobs_Inserted")
            try await sender.notify("jobs_Inserted", payload: "job 42")
            let notifications = try await listener.waitForNotifications(timeout: .seconds(5))
            #expect(notifications == [PostgresNotification(channel: "jobs_Inserted", payload: "job 42", pid: sender.backendPID)])

            let clock = ContinuousClock()
            let started = clock.now
            let none = try await listener.waitForNotifications(timeout: .milliseconds(300))
            let waited = clock.now - started
            #expect(none.isEmpty)
            #expect(waited >= .milliseconds(290) && waited < .seconds(3))

            // Notifications that arrive while a query runs are kept for the next wait.
            try await sender.notify("jobs_Inserted", payload: "second")
            try await Task.sleep(for: .milliseconds(100))
            _ = try await listener.query("SELECT 1")
            let buffered = try await listener.waitForNotifications(timeout: .milliseconds(10))
            #expect(buffered.map(\.payload) == ["second"])
        }
    }

    /// Either way a statement waits (the queue's thread, or the reply watcher).
    @Test(arguments: [false, true])
    func cancellingTheTaskCancelsTheStatement(watchingReplies: Bool) async throws {
        try await withTestSchema { schema in
            let connection = try await schema.connect(watchingReplies: watchingReplies)
            defer { connection.close() }
            let clock = ContinuousClock()
            let started = clock.now
            let marker = "cancel-\(UUID().uuidString)"
            let task = Task { try await connection.query("SELECT pg_sleep(20) /* \(unsafeSQL: marker) */") }
            // Cancel only once the statement runs on the server: a cancel that arrives earlier is
            // one the server never sees, and the test would wait out the sleep instead.
            let observer = try await schema.connect()
            defer { observer.close() }
            try await waitUntilRunning(marker, seenBy: observer)
            task.cancel()
            let error = await #expect(throws: PostgresError.self) { try await task.value }
            #expect(error?.sqlState == "57014")
            #expect(clock.now - started < .seconds(10))
            #expect(try await connection.query("SELECT 1 AS one").count == 1)
        }
    }

    /// `close()` while a statement awaits its reply (sent from its task, the socket watched, no
    /// thread of the connection's queue held): the statement still gets its rows, and the session
    /// closes right after; the next call throws `connectionClosed`.
    @Test func closeWaitsForTheReplyInFlight() async throws {
        try await withTestSchema { schema in
            let connection = try await schema.connect(watchingReplies: true)
            let marker = "close-\(UUID().uuidString)"
            // Kept outside the task, so that a reply that never comes fails the wait below, not the run.
            let seven = Locked<Result<Int, PostgresError>?>(nil)
            Task {
                do {
                    let rows = try await connection.query("SELECT pg_sleep(0.5), 7 AS seven /* \(unsafeSQL: marker) */")
                    let value = try rows[0].decode(Int.self, column: "seven")
                    seven.withLock { $0 = .success(value) }
                } catch {
                    seven.withLock { $0 = .failure(error as? PostgresError ?? PostgresError(.queryFailed, message: "\(error)")) }
                }
            }
            let observer = try await schema.connect()
            defer { observer.close() }
            try await waitUntilRunning(marker, seenBy: observer)
            connection.close()
            try await waitUntil("the statement's reply", timeout: .seconds(10)) { seven.withLock { $0 != nil } }
            #expect(try seven.withLock { $0 }?.get() == 7)
            let error = await #expect(throws: PostgresError.self) { try await connection.query("SELECT 1") }
            #expect(error?.code == .connectionClosed)
            try await waitUntil("the session has ended at the server", timeout: .seconds(10)) {
                try await observer.query(
                    "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%' || \(marker) || '%' AND pid <> pg_backend_pid()"
                )[0].decode(Int.self, at: 0) == 0
            }
        }
    }

    /// Tasks sharing one connection take turns (`SessionTurns`): each gets its own statement's rows,
    /// prepared or not, also where a statement's reply leaves the connection's queue free.
    @Test(arguments: [false, true])
    func tasksSharingAConnectionTakeTurns(watchingReplies: Bool) async throws {
        try await withTestSchema { schema in
            let connection = try await schema.connect(watchingReplies: watchingReplies)
            defer { connection.close() }
            let answers = try await withThrowingTaskGroup(of: (Int, Int).self) { group in
                for index in 0..<40 {
                    group.addTask {
                        let query: PostgresQuery = "SELECT \(index)::int8 + 0 * length(pg_sleep(0.01)::text) AS n"
                        let rows = try await (index % 2 == 0 ? connection.query(query) : connection.queryPrepared(query))
                        return (index, try rows[0].decode(Int.self, column: "n"))
                    }
                }
                return try await group.reduce(into: [Int: Int]()) { $0[$1.0] = $1.1 }
            }
            #expect(answers == Dictionary(uniqueKeysWithValues: (0..<40).map { ($0, $0) }))
        }
    }

    @Test func blockingAPIWorksFromADedicatedThread() async throws {
        try await withTestSchema { schema in
            let conninfo = schema.conninfo
            let count = try await onDedicatedThread {
                let connection = try PostgresConnection.connectBlocking(to: conninfo, logger: TestDatabase.logger)
                defer { connection.close() }
                try connection.simpleQueryBlocking("CREATE TABLE batch (n bigint)")
                let numbers = (1...1000).map(Int64.init)
                let inserted = try connection.withTransactionBlocking { transaction in
                    try transaction.executeBlocking("INSERT INTO batch SELECT unnest(\(numbers))")
                }
                #expect(try connection.resetIfBrokenBlocking() == false)
                let rows = try connection.queryBlocking("SELECT count(*) AS n FROM batch")
                #expect(try rows[0].decode(Int.self, column: "n") == inserted)
                return inserted
            }
            #expect(count == 1000)
        }
    }

    /// The receiver's INSERT is prepared once per session and runs with the previous batch's answers
    /// written meanwhile. Behind a transaction-pooling proxy a session may lack the statement: the
    /// connection must then run it exactly once, unnamed, and stop preparing.
    @Test func preparedStatementsRunOnceEvenWhenTheSessionLosesThem() async throws {
        try await withTestSchema { schema in
            let conninfo = schema.conninfo
            try await onDedicatedThread {
                let connection = try PostgresConnection.connectBlocking(to: conninfo, logger: TestDatabase.logger)
                defer { connection.close() }
                try connection.simpleQueryBlocking("CREATE TABLE hits (n bigint PRIMARY KEY)")
                func prepared() throws -> Int {
                    try connection.queryBlocking("SELECT count(*) AS n FROM pg_prepared_statements")[0]
                        .decode(Int.self, column: "n")
                }
                var meanwhileCalls = 0
                func insert(_ n: Int64) throws -> Int {
                    try connection.executePreparedBlocking("INSERT INTO hits VALUES (\(n))") { meanwhileCalls += 1 }
                }
                for n in Int64(1)...3 { #expect(try insert(n) == 1) }
                #expect(try prepared() == 1)
                #expect(meanwhileCalls == 3)

                try connection.simpleQueryBlocking("DEALLOCATE ALL")
                for n in Int64(4)...5 { #expect(try insert(n) == 1) }
                #expect(try prepared() == 0)
                #expect(meanwhileCalls == 5)
                let rows = try connection.queryBlocking("SELECT count(*) AS n, sum(n) AS total FROM hits")
                #expect(try rows[0].decode(Int.self, column: "n") == 5)
                #expect(try rows[0].decode(Int.self, column: "total") == 15)

                // A failing statement still runs `meanwhile`, once, and reports the server's error.
                do {
                    _ = try insert(1)
                    Issue.record("a duplicate key was inserted")
                } catch let error as PostgresError {
                    #expect(error.sqlState == "23505")
                }
                // So does one that cannot be sent at all.
                #expect(throws: PostgresError.self) {
                    try connection.executePreparedBlocking("INSERT INTO hits VALUES (\(Int64(9)), \("nul\u{0}"))") {
                        meanwhileCalls += 1
                    }
                }
                #expect(meanwhileCalls == 7)
            }
        }
    }

    /// The app API's hot statements are prepared once a session. A migration may change a
    /// function's result type under a prepared call (the server then refuses the plan, 0A000,
    /// before running anything): the call still runs, once, and the next one prepares anew. A
    /// session that lost its statements (a pooling proxy) gets them unnamed, as for execute.
    @Test(arguments: [false, true])
    func preparedQueriesOutliveAChangedResultType(watchingReplies: Bool) async throws {
        try await withTestSchema { schema in
            let connection = try await schema.connect(watchingReplies: watchingReplies)
            defer { connection.close() }
            try await connection.simpleQuery(
                """
                CREATE TABLE calls (n int);
                CREATE FUNCTION answer(p int) RETURNS TABLE (a int) LANGUAGE sql AS $$
                    INSERT INTO calls VALUES (p) RETURNING p $$;
                """)
            func prepared() async throws -> Int {
                try await connection.query("SELECT count(*) AS n FROM pg_prepared_statements")[0].decode(Int.self, column: "n")
            }
            func call(_ p: Int32) async throws -> PostgresRows { try await connection.queryPrepared("SELECT * FROM answer(\(p))") }
            #expect(try await call(1)[0].decode(Int.self, column: "a") == 1)
            #expect(try await call(2)[0].decode(Int.self, column: "a") == 2)
            #expect(try await prepared() == 1)

            try await connection.simpleQuery(
                """
                DROP FUNCTION answer(int);
                CREATE FUNCTION answer(p int) RETURNS TABLE (a int, b text) LANGUAGE sql AS $$
                    INSERT INTO calls VALUES (p) RETURNING p, 'new' $$;
                """)
            let changed = try await call(3)
            #expect(try changed[0].decode(String.self, column: "b") == "new")
            #expect(try await call(4)[0].decode(Int.self, column: "a") == 4)
            #expect(try await prepared() == 1)

            try await connection.simpleQuery("DEALLOCATE ALL")
            #expect(try await call(5)[0].decode(Int.self, column: "a") == 5)
            #expect(try await prepared() == 0)
            let rows = try await connection.query("SELECT count(*) AS n, sum(n) AS total FROM calls")
            #expect(try rows[0].decode(Int.self, column: "n") == 5)
            #expect(try rows[0].decode(Int.self, column: "total") == 15)
        }
    }

    @Test func poolLeaseWaitIsBounded() async throws {
        try await withTestSchema { schema in
            let pool = PostgresPool(
                conninfo: schema.conninfo, size: 1, acquireTimeout: .milliseconds(200), logger: TestDatabase.logger)
            defer { pool.close() }
            try await pool.withConnection { _ in
                let error = await #expect(throws: PostgresError.self) {
                    try await pool.withConnection { connection in try await connection.execute("SELECT 1") }
                }
                #expect(error?.code == .timeout)
            }
            #expect(pool.openConnections == 1)
        }
    }

    /// `statementTimeout` cancels a statement at the server and throws `timeout`.
    @Test(arguments: [false, true])
    func statementTimeoutCancelsTheStatement(watchingReplies: Bool) async throws {
        try await withTestSchema { schema in
            let pool = PostgresPool(
                conninfo: schema.conninfo, size: 1, acquireTimeout: .seconds(30), watchingReplies: watchingReplies,
                logger: TestDatabase.logger)
            defer { pool.close() }
            let error = await #expect(throws: PostgresError.self) {
                try await PostgresConnection.$statementTimeout.withValue(.milliseconds(300)) {
                    try await pool.withConnection { connection in try await connection.execute("SELECT pg_sleep(120)") }
                }
            }
            #expect(error?.code == .timeout, "\(String(describing: error))")
            // Cancelled, not abandoned: the same connection answers the next statement.
            let one = try await pool.withConnection { connection in try await connection.query("SELECT 1")[0].decode(Int.self, at: 0) }
            #expect(one == 1)
            #expect(pool.openConnections == 1)
        }
    }

    @Test func poolWaiterGetsTheReleasedConnection() async throws {
        try await withTestSchema { schema in
            // A bound far above the 0.1 s hold, so a loaded machine cannot turn a hand-off into a timeout.
            let pool = PostgresPool(
                conninfo: schema.conninfo, size: 1, acquireTimeout: .seconds(30), logger: TestDatabase.logger)
            defer { pool.close() }
            async let a = pool.withConnection { connection in try await connection.query("SELECT pg_sleep(0.1)").count }
            async let b = pool.withConnection { connection in try await connection.query("SELECT 1").count }
            let rows = try await a + b
            #expect(rows == 2)
            #expect(pool.openConnections == 1)
        }
    }
}

/// Runs `body` on a thread of its own (the blocking API must not run on the concurrency pool).
private func onDedicatedThread<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread { continuation.resume(with: Result { try body() }) }.start()
    }
}

/// Waits until a statement whose text holds `marker` runs on the server, as `observer` sees it.
private func waitUntilRunning(_ marker: String, seenBy observer: PostgresConnection) async throws {
    try await waitUntil("the statement runs on the server", timeout: .seconds(10)) {
        try await observer.query(
            """
            SELECT count(*) FROM pg_stat_activity
             WHERE pid <> pg_backend_pid() AND state = 'active' AND query LIKE '%' || \(marker) || '%'
            """)[0].decode(Int.self, at: 0) == 1
    }
}
