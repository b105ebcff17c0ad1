import Foundation
import Postgres
import Testing

/// The retry rule as a table: what a failure does to a job, one sentence a row, checked against
/// `siwa.job_retry` (sql/functions/jobs.sql) and against what the real writers do to a real job
/// row: `siwa.fail_jobs` (the Apple-calling jobs' failures and the notification batch's) for a
/// `failure`, `siwa.rescue_expired_jobs` for a `death` (a process that died running it). Changing
/// when a job is retried or discarded is one line of that function and one row here.
///
/// A row: `failure <n> of <max>` (the n-th failure, this one included, of a job allowed max
/// attempts; `of 0`: a failure that cannot succeed by retrying) or `death <n> of 3` (its lease ran
/// out with no outcome, the n-th time), then optionally `with backoff <base> s capped at <cap> s` and
/// `and Retry-After <s> s`, then `is retried within <lo>–<hi> s` (the full jitter's range), `is
/// retried in exactly <s> s`, or `is discarded, its run_at kept`. A death has no backoff.
@Suite struct JobRetryTableTests {
    static let table = """
        failure 1 of 25 with backoff 1 s capped at 3600 s is retried within 0–1 s
        failure 2 of 25 with backoff 1 s capped at 3600 s is retried within 0–2 s
        failure 4 of 25 with backoff 1 s capped at 3600 s is retried within 0–8 s
        failure 13 of 25 with backoff 1 s capped at 3600 s is retried within 0–3600 s
        failure 24 of 25 with backoff 1 s capped at 3600 s is retried within 0–3600 s
        failure 25 of 25 with backoff 1 s capped at 3600 s is discarded, its run_at kept
        failure 26 of 25 with backoff 1 s capped at 3600 s is discarded, its run_at kept
        failure 3 of 5 with backoff 0.5 s capped at 1 s is retried within 0–1 s
        failure 9999 of 2147483647 with backoff 1 s capped at 600 s is retried within 0–600 s
        failure 1 of 25 with backoff 1 s capped at 3600 s and Retry-After 30 s is retried in exactly 30 s
        failure 12 of 25 with backoff 1 s capped at 3600 s and Retry-After 30 s is retried within 30–2048 s
        failure 5 of 5 with backoff 1 s capped at 3600 s and Retry-After 30 s is discarded, its run_at kept
        failure 1 of 0 with backoff 1 s capped at 3600 s is discarded, its run_at kept
        death 1 of 3 is retried in exactly 0 s
        death 2 of 3 is retried in exactly 0 s
        death 3 of 3 is discarded, its run_at kept
        """

    static var rows: [Row] {
        get throws { try table.split(separator: "\n").map { try Row(sentence: String($0)) } }
    }

    /// The function says what the table says, row by row (each row drawn 50 times: the jitter).
    @Test func jobRetryIsTheTable() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            for row in try Self.rows {
                for _ in 0..<50 {
                    let found = try await connection.query("""
                        SELECT r.state, extract(epoch FROM r.run_at - now())::float8
                          FROM siwa.job_retry(\(row.count)::integer, \(row.of)::integer, \(row.retryAfter)::float8,
                                              \(row.base)::float8, \(row.cap)::float8, now() - interval '1 day') r
                        """)[0]
                    let seen = try row.check(state: found.decode(String.self, at: 0), delay: found.decode(Double.self, at: 1))
                    #expect(seen == nil, "\(row.sentence)\n   the function: \(seen ?? "")")
                }
            }
        }
    }

    /// Full jitter: delays spread over the whole range, not bunched at its top (equal jitter) or fixed.
    @Test func theBackoffIsFullJitter() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            let row = try await connection.query("""
                SELECT min(d), max(d) FROM (SELECT extract(epoch FROM r.run_at - now())::float8 AS d
                                              FROM generate_series(1, 200) g,
                                                   LATERAL siwa.job_retry(5 + 0 * g, 25, NULL, 1, 3600, now()) r) draws
                """)[0]
            #expect(try row.decode(Double.self, at: 0) < 4, "the 5th failure's ceiling is 16 s: some draws below a quarter")
            #expect(try row.decode(Double.self, at: 1) > 12, "and some above three quarters")
        }
    }

    /// Each row through the writer that uses the rule, on a real job row: a failure through
    /// `siwa.fail_jobs` (leased, and as the notification batch holds it: row-locked), a death through
    /// `siwa.rescue_expired_jobs`.
    @Test(arguments: [false, true]) func theWritersDoWhatTheTableSays(rowLocked: Bool) async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            for (index, row) in try Self.rows.enumerated() {
                let death = row.kind == "death"
                if death && rowLocked { continue }
                // `errors` holds the earlier failures; a death's count is in expired_leases.
                let id = try await connection.query("""
                    INSERT INTO siwa.jobs (kind, client_id, sub, state, attempt, max_attempts, run_at, errors,
                                           expired_leases, locked_by, locked_until)
                    SELECT 'reconcile', 'com.example.app', \("retry.\(index)"),
                           CASE WHEN \(rowLocked) THEN 'available' ELSE 'running' END, 7, \(death ? 25 : row.of)::integer,
                           now() - interval '1 day',
                           coalesce((SELECT jsonb_agg(jsonb_build_object('attempt', n, 'error', 'earlier'))
                                       FROM generate_series(1, \(death ? 0 : row.count - 1)::integer) n), '[]'),
                           \(death ? row.count - 1 : 0)::integer, 'test', now() - interval '1 second'
                    RETURNING id
                    """)[0].decode(Int64.self, at: 0)
                // The write and the read in one transaction: now() is the write's.
                let written = try await connection.withTransaction { connection in
                    if death {
                        _ = try await connection.query("SELECT * FROM siwa.rescue_expired_jobs()")
                    } else {
                        _ = try await connection.query("""
                            SELECT * FROM siwa.fail_jobs(ARRAY[\(id)]::bigint[], ARRAY[7], ARRAY['503'],
                                                         ARRAY[\(row.retryAfter)::float8], ARRAY[\(row.of == 0)],
                                                         \(row.base)::float8, \(row.cap)::float8, \(rowLocked))
                            """)
                    }
                    let row = try await connection.query("""
                        SELECT state, extract(epoch FROM run_at - now())::float8, errors -> -1 ->> 'error'
                          FROM siwa.jobs WHERE id = \(id)
                        """)[0]
                    return (try row.decode(String.self, at: 0), try row.decode(Double.self, at: 1), try row.decode(String?.self, at: 2))
                }
                let seen = row.check(state: written.0, delay: written.1)
                #expect(seen == nil, "\(row.sentence)\n   \(death ? "the rescue" : "siwa.fail_jobs"): \(seen ?? "")")
                let lastError = written.2
                let expectedError = death ? (row.discarded ? "process_died" : nil) : "503"
                #expect(lastError == expectedError, "\(row.sentence): the last error recorded")
            }
        }
    }

    /// One row of the table.
    struct Row {
        var sentence: String
        var kind: String
        var count: Int
        var of: Int
        var base: Double = 0
        var cap: Double = 0
        var retryAfter: Double?
        /// The delay's range in seconds; nil when discarded.
        var within: ClosedRange<Double>?
        var discarded: Bool { within == nil }

        /// Parses a row of the table (the grammar is the suite's comment).
        init(sentence: String) throws {
            self.sentence = sentence
            let grammar = #/^(failure|death) (\d+) of (\d+)(?: with backoff ([\d.]+) s capped at ([\d.]+) s)?(?: and Retry-After ([\d.]+) s)? is (?:retried within ([\d.]+)–([\d.]+) s|retried in exactly ([\d.]+) s|(discarded, its run_at kept))$/#
            guard let match = sentence.firstMatch(of: grammar), let count = Int(match.2), let of = Int(match.3) else {
                throw Unreadable(sentence: sentence)
            }
            (kind, self.count, self.of) = (String(match.1), count, of)
            if kind == "death" && (of != 3 || match.4 != nil || match.6 != nil) { throw Unreadable(sentence: sentence) }
            if let base = match.4.flatMap({ Double($0) }), let cap = match.5.flatMap({ Double($0) }) { (self.base, self.cap) = (base, cap) }
            retryAfter = match.6.flatMap { Double($0) }
            if let low = match.7.flatMap({ Double($0) }), let high = match.8.flatMap({ Double($0) }) {
                within = low...high
            } else if let exactly = match.9.flatMap({ Double($0) }) {
                within = exactly...exactly
            } else if match.10 == nil {
                throw Unreadable(sentence: sentence)
            }
        }

        /// nil when `state` and `delay` (run_at - now, in seconds) are what the row says; else what was seen.
        func check(state: String, delay: Double) -> String? {
            if let within {
                let tolerance = 1e-6
                if state == "available", delay >= within.lowerBound - tolerance, delay <= within.upperBound + tolerance { return nil }
                return "\(state), due in \(delay) s"
            }
            // Discarded: the run_at stays as it was, a day ago (give or take the seconds between the
            // row's insert and the write, on a loaded machine; a retry is never due in the past).
            if state == "discarded", abs(delay + 86_400) < 3_600 { return nil }
            return "\(state), run_at \(delay) s from now"
        }
    }

    struct Unreadable: Error, CustomStringConvertible {
        let sentence: String
        var description: String { "not a row of the retry rule's table: \(sentence)" }
    }
}
