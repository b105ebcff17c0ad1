import Foundation

/// Polls `condition` every `interval` until it holds: the tests' one bounded wait. `timeout` is a
/// bound for a hang (scaled by `TestTimeScale`), never a speed requirement; the condition gets one
/// last look after the deadline, so a state reached while this task was not scheduled still counts.
/// The error names what was awaited, and `detail` (evaluated only on failure) what was seen instead.
package func waitUntil(
    _ what: @autoclosure () -> String, timeout: Duration = .seconds(30), every interval: Duration = .milliseconds(20),
    detail: @autoclosure () -> String = "", _ condition: () async throws -> Bool
) async throws {
    let limit = TestTimeScale.scaled(timeout)
    let deadline = ContinuousClock.now + limit
    while true {
        if try await condition() { return }
        guard ContinuousClock.now < deadline else {
            if try await condition() { return }
            throw WaitTimedOut(what: what(), limit: limit, seen: detail())
        }
        try await Task.sleep(for: interval)
    }
}

/// `waitUntil` for a thread of its own that may block (a server's handler thread, a C callback),
/// never for a task on the cooperative pool.
package func waitUntilBlocking(
    _ what: @autoclosure () -> String, timeout: Duration = .seconds(30), every interval: Duration = .milliseconds(5),
    _ condition: () throws -> Bool
) throws {
    let limit = TestTimeScale.scaled(timeout)
    let deadline = ContinuousClock.now + limit
    while true {
        if try condition() { return }
        guard ContinuousClock.now < deadline else {
            if try condition() { return }
            throw WaitTimedOut(what: what(), limit: limit, seen: "")
        }
        Thread.sleep(forTimeInterval: Double(interval.components.attoseconds) / 1e18 + Double(interval.components.seconds))
    }
}

package struct WaitTimedOut: Error, CustomStringConvertible {
    package var what: String
    package var limit: Duration
    package var seen: String
    package var description: String { "timed out after \(limit) waiting until \(what)\(seen.isEmpty ? "" : ": " + seen)" }
}
