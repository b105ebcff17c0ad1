import Foundation

/// How much slower than usual this run may be: `SIWA_TEST_TIME_SCALE` (a number ≥ 1, default 1).
/// `deploy/sanitize.sh` sets it, since ThreadSanitizer runs the tests, the in-process fake Apple and
/// the child processes several times slower. A fixed bound on a client's wait (an HTTP timeout,
/// the Apple calls' timeout) is written for normal speed and scaled by this, so a sanitizer run does
/// not fail on time alone and a normal run keeps its bounds tight. Durations a test asserts on are
/// not scaled: only bounds that exist so nothing waits forever.
enum TestTimeScale {
    static let factor: Double = {
        guard let text = ProcessInfo.processInfo.environment["SIWA_TEST_TIME_SCALE"], let value = Double(text),
            value >= 1
        else { return 1 }
        return value
    }()

    static func scaled(_ duration: Duration) -> Duration { duration * factor }
    static func scaled(seconds: TimeInterval) -> TimeInterval { seconds * factor }
}

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
