import Foundation
import Postgres
import Testing

/// The webhook delivery rule as a table: what an attempt's result does to a delivery, one sentence
/// a row, checked through the real write, `siwa.finish_webhook_deliveries` (which asks
/// `siwa.webhook_retry`, sql/functions/jobs.sql), on real job rows with the contract's retry window
/// of 24 hours (86,400 s). Changing when a delivery is retried or discarded is one line of that
/// function and one row here.
///
/// A row: `a delivery answered <status>`, `that got no answer` or `with nothing to send` (its change
/// row is gone), then `after no failure` or `after <n> failure(s), the first <s> s ago` (the
/// failures recorded before this attempt), optionally `with backoff <base> s capped at <cap> s`
/// (else 1 s capped at 3600 s, the worker's defaults), then `is delivered (`<outcome>`)`, `is
/// retried within <lo>–<hi> s` (the full jitter's range) or `is discarded, its run_at kept`. Every
/// delivery waited two days in the queue before this attempt: the window runs from the first
/// failure, not from the change.
@Suite struct WebhookRetryTableTests {
    static let table = """
        a delivery answered 204 after no failure is delivered (`delivered 204`)
        a delivery answered 200 after 40 failures, the first 90000 s ago, is delivered (`delivered 200`)
        a delivery with nothing to send after 3 failures, the first 10 s ago, is delivered (`change_missing`)
        a delivery answered 500 after no failure is retried within 0–1 s
        a delivery answered 302 after no failure is retried within 0–1 s
        a delivery answered 404 after no failure is retried within 0–1 s
        a delivery answered 100 after no failure is retried within 0–1 s
        a delivery that got no answer after no failure is retried within 0–1 s
        a delivery that got no answer after no failure with backoff 0.5 s capped at 1 s is retried within 0–0.5 s
        a delivery that got no answer after 4 failures, the first 10 s ago, is retried within 0–16 s
        a delivery answered 503 after 12 failures, the first 3600 s ago, is retried within 0–3600 s
        a delivery answered 503 after 12 failures, the first 3600 s ago, with backoff 1 s capped at 60 s is retried within 0–60 s
        a delivery answered 503 after 30 failures, the first 86000 s ago, is retried within 0–400 s
        a delivery answered 503 after 30 failures, the first 86399 s ago, is retried within 0–1 s
        a delivery answered 503 after 30 failures, the first 86400 s ago, is discarded, its run_at kept
        a delivery that got no answer after 1 failure, the first 90000 s ago, is discarded, its run_at kept
        """

    static let window = 86_400.0
    /// Deliveries per row, all written by one call: the jitter draws differ.
    static let draws = 20

    static var rows: [Row] {
        get throws { try table.split(separator: "\n").map { try Row(sentence: String($0)) } }
    }

    @Test func theFinishDoesWhatTheTableSays() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            for (index, row) in try Self.rows.enumerated() {
                // The rows, the write and the read in one transaction: now() is the write's, so a
                // first failure `86400 s ago` is exactly the window's length ago.
                let written = try await connection.withTransaction { connection in
                    let ids = try await connection.query("""
                        INSERT INTO siwa.jobs (kind, priority, client_id, sub, args, state, attempt, max_attempts,
                                               created_at, run_at, errors, locked_by, locked_until)
                        SELECT 'webhook', 3, 'com.example.app', 'retry.' || \(index)::integer || '.' || k,
                               jsonb_build_object('change_id', 1000 + k), 'running', 7, 2147483647,
                               now() - interval '2 days', now() - interval '2 days',
                               coalesce((SELECT jsonb_agg(jsonb_build_object(
                                                 'attempt', n, 'error', 'earlier',
                                                 'at', now() - make_interval(secs => \(row.firstFailedSecondsAgo)::float8) + (n - 1) * interval '1 microsecond')
                                                 ORDER BY n)
                                           FROM generate_series(1, \(row.failures)::integer) n), '[]'),
                               'test', now() + interval '1 minute'
                          FROM generate_series(1, \(Self.draws)) k
                        RETURNING id
                        """).map { try $0.decode(Int64.self, at: 0) }
                    let finished = try await connection.query("""
                        SELECT job_id, state, retry_in FROM siwa.finish_webhook_deliveries(
                            \(ids)::bigint[], array_fill(7::bigint, ARRAY[\(ids.count)::integer]),
                            array_fill(\(row.status)::integer, ARRAY[\(ids.count)::integer]),
                            array_fill(\(row.error)::text, ARRAY[\(ids.count)::integer]),
                            \(Self.window)::float8, \(row.base)::float8, \(row.cap)::float8)
                        """)
                    #expect(finished.count == ids.count, "\(row.sentence): every delivery written")
                    return try await connection.query("""
                        SELECT state, extract(epoch FROM run_at - now())::float8, outcome,
                               jsonb_array_length(errors) || ' errors, the last ' || coalesce(errors -> -1 ->> 'error', 'none'),
                               finalized_at IS NOT NULL, locked_by IS NULL AND args ? 'change_id'
                          FROM siwa.jobs WHERE id = ANY (\(ids)::bigint[]) ORDER BY id
                        """).map { found -> Written in
                        (try found.decode(String.self, at: 0), try found.decode(Double.self, at: 1), try found.decode(String?.self, at: 2),
                         try found.decode(String.self, at: 3), try found.decode(Bool.self, at: 4), try found.decode(Bool.self, at: 5))
                    }
                }
                for job in written {
                    let seen = row.check(job)
                    #expect(seen == nil, "\(row.sentence)\n   siwa.finish_webhook_deliveries: \(seen ?? "")")
                }
            }
        }
    }

    /// What the write left on a job row: its state, when it is due (seconds from now), its outcome,
    /// `<n> errors, the last <text>`, whether it is finalized, and whether it is unleased with its
    /// change id kept.
    typealias Written = (state: String, delay: Double, outcome: String?, errors: String, finalized: Bool, kept: Bool)

    /// One row of the table.
    struct Row {
        var sentence: String
        /// The status answered; 0 for none.
        var status: Int
        /// The error text the sender reports; "" for none.
        var error: String
        var failures: Int
        var firstFailedSecondsAgo: Double = 0
        var base: Double = 1
        var cap: Double = 3600
        var delivered: String?
        /// The delay's range in seconds; nil when delivered or discarded.
        var within: ClosedRange<Double>?

        /// Parses a row of the table (the grammar is the suite's comment).
        init(sentence: String) throws {
            self.sentence = sentence
            let grammar = #/^a delivery (?:answered (\d+)|(that got no answer)|(with nothing to send)) after (?:no failure|(\d+) failures?, the first ([\d.]+) s ago,)(?: with backoff ([\d.]+) s capped at ([\d.]+) s)? is (?:delivered \(`([a-z_ \d]+)`\)|retried within ([\d.]+)–([\d.]+) s|(discarded, its run_at kept))$/#
            guard let match = sentence.firstMatch(of: grammar) else { throw Unreadable(sentence: sentence) }
            if let status = match.1.flatMap({ Int($0) }) {
                (self.status, error) = (status, "answered \(status)")
            } else if match.2 != nil {
                (status, error) = (0, "no answer within the timeout")
            } else {
                (status, error) = (0, "")
            }
            failures = match.4.flatMap { Int($0) } ?? 0
            firstFailedSecondsAgo = match.5.flatMap { Double($0) } ?? 0
            if let base = match.6.flatMap({ Double($0) }), let cap = match.7.flatMap({ Double($0) }) { (self.base, self.cap) = (base, cap) }
            delivered = match.8.map { String($0) }
            if let low = match.9.flatMap({ Double($0) }), let high = match.10.flatMap({ Double($0) }) {
                within = low...high
            } else if delivered == nil && match.11 == nil {
                throw Unreadable(sentence: sentence)
            }
        }

        /// nil when the written job is what the row says; else what was seen.
        func check(_ job: Written) -> String? {
            var wrong: [String] = []
            if !job.kept { wrong.append("still leased, or its change id gone") }
            if let delivered {
                if job.state != "completed" || job.outcome != delivered { wrong.append("\(job.state), outcome \(job.outcome ?? "none")") }
                if job.errors != "\(failures) errors, the last \(failures == 0 ? "none" : "earlier")" { wrong.append(job.errors) }
                if !job.finalized { wrong.append("not finalized") }
                return wrong.isEmpty ? nil : wrong.joined(separator: "; ")
            }
            // A failure: its error recorded after the earlier ones, whatever follows.
            if job.errors != "\(failures + 1) errors, the last \(error)" { wrong.append(job.errors) }
            if let within {
                let tolerance = 1e-6
                if job.state != "available" || job.delay < within.lowerBound - tolerance || job.delay > within.upperBound + tolerance {
                    wrong.append("\(job.state), due in \(job.delay) s")
                }
                if job.finalized { wrong.append("finalized") }
            } else {
                // Discarded and kept: its run_at stays as it was, two days ago.
                if job.state != "discarded" || abs(job.delay + 2 * 86_400) > 1 { wrong.append("\(job.state), run_at \(job.delay) s from now") }
                if !job.finalized { wrong.append("not finalized") }
            }
            return wrong.isEmpty ? nil : wrong.joined(separator: "; ")
        }
    }

    struct Unreadable: Error, CustomStringConvertible {
        let sentence: String
        var description: String { "not a row of the webhook retry rule's table: \(sentence)" }
    }
}
