package import Foundation

/// How much slower than usual this run may be: `SIWA_TEST_TIME_SCALE` (a number ≥ 1, default 1).
/// `deploy/sanitize.sh` sets it, since ThreadSanitizer runs the tests, the in-process fake Apple and
/// the child processes several times slower. A fixed bound on a client's wait (an HTTP timeout,
/// the Apple calls' timeout) is written for normal speed and scaled by this, so a sanitizer run does
/// not fail on time alone and a normal run keeps its bounds tight. Durations a test asserts on are
/// not scaled: only bounds that exist so nothing waits forever.
package enum TestTimeScale {
    package static let factor: Double = {
        guard let text = ProcessInfo.processInfo.environment["SIWA_TEST_TIME_SCALE"], let value = Double(text),
            value >= 1
        else { return 1 }
        return value
    }()

    package static func scaled(_ duration: Duration) -> Duration { duration * factor }
    package static func scaled(seconds: TimeInterval) -> TimeInterval { seconds * factor }
    /// For a `.timeLimit(.minutes(_:))` trait: whole minutes, rounded up.
    package static func scaled(minutes: Int) -> Int { Int((Double(minutes) * factor).rounded(.up)) }
}
