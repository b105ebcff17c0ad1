import Foundation
import Postgres
import TestTiming
import Testing

/// The change feed (`siwa.account_changes_after`, what `GET /v1/changes` serves) under random
/// interleavings of writers that take change ids, commit and roll back in any order, and a reader
/// paging with `after = next`. Whatever the order, the reader must be handed every committed
/// change exactly once, in id order, and must not stall on a rolled-back id once nothing is open.
///
/// `SIWA_FEED_MODEL_SEQUENCES` (default 150), `SIWA_FEED_MODEL_SEED` (default random, printed).
@Suite struct ChangeFeedModelTests {
    static let writers = 3

    enum Step: CustomStringConvertible {
        /// Writer `w` (opening its transaction if needed) inserts `rows` change rows in one statement.
        case write(Int, rows: Int)
        case commit(Int)
        case rollback(Int)
        /// A page with no wait: what the feed serves while writers may be open.
        case read(limit: Int)
        /// A page allowed to wait; every open writer ends (commit or rollback) while it waits.
        case readWhileWritersEnd(limit: Int, commit: Bool)

        var description: String {
            switch self {
            case .write(let w, let rows): "writer \(w) inserts \(rows)"
            case .commit(let w): "writer \(w) commits"
            case .rollback(let w): "writer \(w) rolls back"
            case .read(let limit): "read a page (limit \(limit), no wait)"
            case .readWhileWritersEnd(let limit, let commit):
                "read a page (limit \(limit)) while every open writer \(commit ? "commits" : "rolls back")"
            }
        }
    }

    static func sequence(seed: UInt64) -> [Step] {
        var random = SeededGenerator(seed: seed)
        return (0..<Int.random(in: 4...30, using: &random)).map { _ in
            let writer = Int.random(in: 0..<writers, using: &random)
            switch Int.random(in: 0..<10, using: &random) {
            case 0...3: return .write(writer, rows: Int.random(in: 1...3, using: &random))
            case 4...5: return .commit(writer)
            case 6: return .rollback(writer)
            case 7...8: return .read(limit: Int.random(in: 1...5, using: &random))
            default: return .readWhileWritersEnd(limit: Int.random(in: 1...5, using: &random), commit: Bool.random(using: &random))
            }
        }
    }

    @Test func everyCommittedChangeIsServedOnceInOrder() async throws {
        let settings = SearchSettings(prefix: "SIWA_FEED_MODEL", countName: "SEQUENCES", defaultCount: 150)
        let (count, seed) = (settings.count, settings.seed)
        print("change feed model: \(count) sequences, seed \(settings.seedText)")
        let database = try await MigratedDatabase.make()
        let reader = try await database.connect()
        let observer = try await database.connect()
        let readerPID = try await reader.query("SELECT pg_backend_pid()")[0].decode(Int32.self, at: 0)
        var writers: [PostgresConnection] = []
        for _ in 0..<Self.writers { writers.append(try await database.connect()) }
        try await withTeardown { teardown in
            teardown.add {
                reader.close()
                observer.close()
                writers.forEach { $0.close() }
                await database.drop()
            }
            var master = SeededGenerator(seed: seed)
            for _ in 0..<count {
                let sequenceSeed = master.next()
                let steps = Self.sequence(seed: sequenceSeed)
                let failure = try await Self.run(steps, reader: reader, readerPID: readerPID, observer: observer, writers: writers)
                #expect(failure == nil, """
                    sequence 0x\(String(sequenceSeed, radix: 16)): \(failure ?? "")
                    \(steps.enumerated().map { "  \($0.offset + 1). \($0.element)" }.joined(separator: "\n"))
                    """)
                if failure != nil { break }
            }
        }
    }

    /// Runs one sequence from a quiet feed; returns what went wrong, if anything.
    static func run(
        _ steps: [Step], reader: PostgresConnection, readerPID: Int32, observer: PostgresConnection, writers: [PostgresConnection]
    ) async throws -> String? {
        var cursor = try await reader.query("SELECT coalesce(max(id), 0) FROM siwa.account_changes")[0].decode(Int64.self, at: 0)
        var open: [Int: [Int64]] = [:]  // writer -> the ids its open transaction took
        var committed: [Int64] = []
        var served: [Int64] = []
        var readNumber = 0

        func end(_ writer: Int, commit: Bool) async throws {
            guard let ids = open.removeValue(forKey: writer) else { return }
            _ = try await writers[writer].execute(commit ? "COMMIT" : "ROLLBACK")
            if commit { committed += ids }
        }
        func page(_ limit: Int, wait: String) async throws -> String? {
            let rows = try await reader.query(
                "SELECT id FROM siwa.account_changes_after(\(cursor), \(Int32(limit)), \(wait)::interval)")
            return take(try rows.map { try $0.decode(Int64.self, at: 0) }, limit: limit)
        }
        func take(_ ids: [Int64], limit: Int) -> String? {
            guard ids.count <= limit else { return "a page of \(ids.count) rows for limit \(limit)" }
            for id in ids {
                guard id > cursor else { return "served \(id) after \(cursor)" }
                guard committed.contains(id) else { return "served \(id), which is not committed" }
                // Final means nothing smaller can still commit: no open writer holds a smaller id.
                if let holder = open.first(where: { $0.value.contains { $0 < id } }) {
                    return "served \(id) while writer \(holder.key) holds \(holder.value.filter { $0 < id })"
                }
                served.append(id)
                cursor = id
            }
            return nil
        }

        for step in steps {
            switch step {
            case .write(let writer, let rows):
                if open[writer] == nil {
                    _ = try await writers[writer].execute("BEGIN")
                    open[writer] = []
                }
                let ids = try await writers[writer].query(
                    """
                    INSERT INTO siwa.account_changes (client_id, sub, change)
                    SELECT 'com.feed.model', 'w\(writer)', 'linked' FROM generate_series(1, \(rows)) RETURNING id
                    """
                ).map { try $0.decode(Int64.self, at: 0) }
                open[writer, default: []] += ids
            case .commit(let writer): try await end(writer, commit: true)
            case .rollback(let writer): try await end(writer, commit: false)
            case .read(let limit):
                if let failure = try await page(limit, wait: "0 s") { return failure }
            case .readWhileWritersEnd(let limit, let commit):
                let after = cursor
                readNumber += 1
                // In the statement's text (a bind would not show in pg_stat_activity.query).
                let marker = "feed_model_read_\(readNumber)"
                let waiting = Task {
                    try await reader.query(
                        "SELECT id AS \(unsafeSQL: marker) FROM siwa.account_changes_after(\(after), \(Int32(limit)), '60 s')"
                    ).map { try $0.decode(Int64.self, at: 0) }
                }
                if !open.isEmpty {
                    // End the writers only once the reader waits for them (or has answered: with
                    // no committed id past the cursor there is nothing to wait for), so a page
                    // that needed the wait can only be right by having waited.
                    do {
                        try await waitUntil("the reader waits or has answered", timeout: .seconds(60), every: .milliseconds(2)) {
                            try await !observer.query(
                                """
                                SELECT 1 FROM pg_stat_activity WHERE pid = \(readerPID) AND strpos(query, \(marker)) > 0
                                   AND (wait_event = 'PgSleep' OR state = 'idle')
                                """
                            ).isEmpty
                        }
                    } catch is WaitTimedOut {
                        return "the reader neither waited nor answered"
                    }
                }
                for writer in open.keys.sorted() { try await end(writer, commit: commit) }
                if let failure = take(try await waiting.value, limit: limit) { return failure }
            }
        }
        // Quiet again: the feed serves the rest, past any rolled-back gap, without waiting.
        for writer in open.keys.sorted() { try await end(writer, commit: writer % 2 == 0) }
        while true {
            let before = served.count
            if let failure = try await page(1000, wait: "0 s") { return failure }
            if served.count == before { break }
        }
        let expected = committed.sorted()
        guard served == expected else { return "served \(served), committed \(expected)" }
        return nil
    }
}
