import Locking
import Logging

/// The app API's refused and timed-out connections, logged at warn at most once a minute per reason
/// with how many there were (Sources/AppAPI/README.md, "The edge"): the first of a quiet spell at once,
/// later ones added up until a minute has passed, then logged with the next one or by `flush()`
/// (the server's minute loop), whichever comes first. The metrics count each one as it happens.
struct AppAPIRefusalLog: Sendable {
    static let interval: Duration = .seconds(60)

    private struct Pending {
        var count = 0
        var lastLogged: ContinuousClock.Instant?
    }

    private let logger: Logger
    private let pending = Locked<[String: Pending]>([:])

    init(logger: Logger) {
        self.logger = logger
    }

    func record(_ reason: String, count: Int) {
        let now = ContinuousClock.now
        let due = pending.withLock { pending -> Int? in
            var entry = pending[reason] ?? Pending()
            entry.count += count
            if let last = entry.lastLogged, now - last < Self.interval {
                pending[reason] = entry
                return nil
            }
            pending[reason] = Pending(count: 0, lastLogged: now)
            return entry.count
        }
        if let due { log(reason, due) }
    }

    /// Logs what a minute and more has added up since the last line of each reason.
    func flush() {
        let now = ContinuousClock.now
        let due = pending.withLock { pending -> [(String, Int)] in
            var due: [(String, Int)] = []
            for (reason, entry) in pending where entry.count > 0 {
                if let last = entry.lastLogged, now - last < Self.interval { continue }
                due.append((reason, entry.count))
                pending[reason] = Pending(count: 0, lastLogged: now)
            }
            return due
        }
        for (reason, count) in due { log(reason, count) }
    }

    private func log(_ reason: String, _ count: Int) {
        logger.warning(
            "app API connections refused", metadata: ["http.refusal": .string(reason), "http.connections": .int(count)])
    }
}
