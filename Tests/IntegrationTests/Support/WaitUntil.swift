import Foundation
import TestTiming

/// Polls `condition` every `interval` until it holds: the tests' one bounded wait. `timeout` is a
/// bound for a hang (scaled by `TestTimeScale`), never a speed requirement; the condition gets one
/// last look after the deadline, so a state reached while this task was not scheduled still counts.
/// The error names what was awaited, and `detail` (evaluated only on failure) what was seen instead.
func waitUntil(
    _ what: @autoclosure () -> String, timeout: Duration = .seconds(30), every interval: Duration = .milliseconds(20),
    detail: @autoclosure () -> String = "", _ condition: () async throws -> Bool
) async throws {
    let limit = TestTimeScale.scaled(timeout)
    let deadline = ContinuousClock.now + limit
    while true {
        if try await condition() { return }
        guard ContinuousClock.now < deadline else {
            let seen = detail()
            throw ServiceProcessError(message: "timed out after \(limit) waiting until \(what())\(seen.isEmpty ? "" : ": " + seen)")
        }
        try await Task.sleep(for: interval)
    }
}
