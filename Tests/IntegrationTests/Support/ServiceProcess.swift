import ChildProcesses
import Foundation
import TestTiming

/// One of our executables (`siwa-receiver`, `siwa-worker`, `siwa`) run as a real child process,
/// with its stdout and stderr (JSON log lines) captured to a file the test can read. The process
/// itself is a `ChildProcess`: its only reaper, which signals it only while it is unreaped, and
/// registers it with the watchdog that stops it should the test process die.
final class ServiceProcess: Sendable {
    let name: String
    let logPath: String
    let child: ChildProcess

    /// The build folder holding the executables: the one this test bundle runs from.
    static var binDirectory: URL {
        let besideTests = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
        if FileManager.default.isExecutableFile(atPath: besideTests.appendingPathComponent("siwa-receiver").path) {
            return besideTests
        }
        return URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent(".build/debug")
    }

    static func executable(_ name: String) throws -> URL {
        let url = binDirectory.appendingPathComponent(name)
        guard FileManager.default.isExecutableFile(atPath: url.path) else {
            throw ServiceProcessError(message: "\(url.path) is missing: build everything first (swift build --build-tests)")
        }
        return url
    }

    /// A clean environment: only what the test says, plus PATH and HOME. Sanitizer settings pass
    /// through, so deploy/sanitize.sh sees reports from the children too.
    static func childEnvironment(_ environment: [String: String]) -> [String: String] {
        let inherited = ProcessInfo.processInfo.environment.filter {
            ["PATH", "HOME", "TSAN_OPTIONS", "ASAN_OPTIONS"].contains($0.key)
        }
        return environment.merging(inherited) { own, _ in own }.merging(["PATH": "/usr/bin:/bin"]) { own, _ in own }
    }

    init(_ name: String, arguments: [String] = [], environment: [String: String]) throws {
        self.name = name
        logPath = FileManager.default.temporaryDirectory.appendingPathComponent("\(name)-\(UUID().uuidString).log").path
        child = try ChildProcess(
            try Self.executable(name).path, arguments,
            options: .init(environment: Self.childEnvironment(environment), output: .file(logPath)))
    }

    var isRunning: Bool { child.isRunning }
    /// "exit" or "signal" once it has ended.
    var terminationReason: String {
        switch child.termination {
        case nil: "running"
        case .exit: "exit"
        case .signal: "signal"
        }
    }
    var processIdentifier: Int32 { child.pid }
    var log: String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }

    /// Sent only while the child is unreaped (see `ChildProcess.signal`); false once it has ended.
    @discardableResult
    func signal(_ number: Int32) -> Bool { child.signal(number) }

    /// The port from the first `http.server.started` log line: services started on port 0 bind one
    /// the kernel picks, so no two tests running side by side can ever be handed the same port.
    /// The bound is for a process that never listens, not a speed requirement: at load 20+ on two
    /// cores a start took over 20 s. The log is read once more after the deadline, so a line that
    /// arrived while this task was not scheduled still counts.
    func boundHTTPPort(timeout: Duration = .seconds(60)) async throws -> Int {
        try await firstLogLine("an http.server.started line", timeout: timeout) { line in
            guard line.contains(#""msg":"http.server.started""#),
                let range = line.range(of: #""http.port":[0-9]+"#, options: .regularExpression)
            else { return nil }
            return Int(line[range].dropFirst(#""http.port":"#.count))
        }
    }

    /// What `match` finds in the first log line it finds something in, once the process has
    /// written it: bounded by `timeout` (scaled), and failing at once, with the log, if the process
    /// exits without it.
    func firstLogLine<T>(
        _ what: @autoclosure () -> String, timeout: Duration = .seconds(60), _ match: (Substring) -> T?
    ) async throws -> T {
        var found: T?
        try await waitUntil("\(name) logged \(what())", timeout: timeout, detail: log) {
            let text = log
            for line in text.split(separator: "\n") {
                if let value = match(line) {
                    found = value
                    break
                }
            }
            if found == nil, !isRunning {
                throw ServiceProcessError(message: "\(name) exited before it logged \(what()):\n\(text)")
            }
            return found != nil
        }
        return found!
    }

    /// Waits for exit (bounded, scaled); the exit code (128 + signal when killed), or nil if it is
    /// still running at the deadline.
    func waitForExit(timeout: Duration = .seconds(20)) async -> Int32? {
        await child.waitForExit(timeout: TestTimeScale.scaled(timeout))?.code
    }

    /// SIGTERM, a bounded wait, then SIGKILL.
    func stop() async { await child.stop(grace: TestTimeScale.scaled(.seconds(10))) }

    deinit { try? FileManager.default.removeItem(atPath: logPath) }
}

struct ServiceProcessError: Error, CustomStringConvertible {
    var message: String
    var description: String { message }
}

/// A program run to its end through `ChildProcess`, stdout and stderr captured in files: the tests'
/// one way to run a command (`siwa ...`, curl, chromium, a printed line).
enum ProgramRun {
    struct Outcome: Sendable {
        var status: Int32
        var stdout: String
        var stderr: String
        /// The child's own peak RSS (wait4's ru_maxrss), kB.
        var peakKilobytes: Int
    }

    struct TimedOut: Error, CustomStringConvertible {
        var description: String
    }

    /// Runs `executable` with exactly `environment` (nil: ours), feeding `input` then closing it;
    /// SIGKILLed and thrown as `TimedOut` after `timeout` (scaled). `mergeOutput` sends stderr to
    /// stdout's file (one offset for both, in the order written).
    static func run(
        _ executable: String, _ arguments: [String], environment: [String: String]?, input: ChildProcess.Input = .none,
        mergeOutput: Bool = false, timeout: Duration = .seconds(60)
    ) async throws -> Outcome {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("siwa-run-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let outPath = directory.appendingPathComponent("out").path, errPath = directory.appendingPathComponent("err").path
        let child = try ChildProcess(
            executable, arguments,
            options: .init(
                environment: environment, input: input, output: .file(outPath), error: mergeOutput ? .sameAsOutput : .file(errPath)))
        let ended = await child.waitForExit(timeout: TestTimeScale.scaled(timeout))
        let stdout = (try? String(contentsOfFile: outPath, encoding: .utf8)) ?? ""
        let stderr = (try? String(contentsOfFile: errPath, encoding: .utf8)) ?? ""
        guard let ended else {
            await child.stop(SIGKILL, grace: .seconds(10))
            throw TimedOut(
                description: "\(executable) \(arguments.joined(separator: " ")) did not finish within \(timeout) (times SIWA_TEST_TIME_SCALE):\n\(stdout)\n\(stderr)")
        }
        return Outcome(status: ended.code, stdout: stdout, stderr: stderr, peakKilobytes: child.peakKilobytes)
    }
}
