import Foundation
import LocalPostgres
import TestTiming

/// One of our executables (`siwa-receiver`, `siwa-worker`, `siwa`) run as a real child process,
/// with its stderr (JSON log lines) captured to a file the test can read.
final class ServiceProcess: @unchecked Sendable {
    // @unchecked: `process` is only touched from the test's own task.
    let name: String
    let logPath: String
    private let process: Process

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
        _ = FileManager.default.createFile(atPath: logPath, contents: nil)
        process = Process()
        process.executableURL = try Self.executable(name)
        process.arguments = arguments
        process.environment = Self.childEnvironment(environment)
        process.standardOutput = FileHandle(forWritingAtPath: logPath)
        process.standardError = FileHandle(forWritingAtPath: logPath)
        process.standardInput = FileHandle.nullDevice
        try process.run()
        // A test process that crashes takes this child with it (the watchdog sees us go).
        OrphanReaper.shared?.watch(pid: process.processIdentifier)
    }

    var isRunning: Bool { process.isRunning }
    /// "exit" or "signal" once it has ended (a status read as a signal's number otherwise).
    var terminationReason: String { process.isRunning ? "running" : process.terminationReason == .exit ? "exit" : "signal" }
    var processIdentifier: Int32 { process.processIdentifier }
    var log: String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }

    func signal(_ number: Int32) { kill(process.processIdentifier, number) }

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

    /// Waits for exit (bounded); returns the status, or nil if it is still running at the deadline.
    func waitForExit(timeout: Duration = .seconds(20)) async -> Int32? {
        let deadline = ContinuousClock.now + TestTimeScale.scaled(timeout)
        while process.isRunning && ContinuousClock.now < deadline { try? await Task.sleep(for: .milliseconds(20)) }
        if process.isRunning { return nil }
        OrphanReaper.shared?.forget(pid: process.processIdentifier)
        return process.terminationStatus
    }

    /// SIGTERM, a bounded wait, then SIGKILL.
    func stop() async {
        guard process.isRunning else { return }
        signal(SIGTERM)
        if await waitForExit(timeout: .seconds(10)) == nil {
            signal(SIGKILL)
            _ = await waitForExit(timeout: .seconds(5))
        }
    }

    deinit {
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        OrphanReaper.shared?.forget(pid: process.processIdentifier)
        try? FileManager.default.removeItem(atPath: logPath)
    }
}

struct ServiceProcessError: Error, CustomStringConvertible {
    var message: String
    var description: String { message }
}

/// A TCP port nothing listens on right now (bind to 0, read it, close).
func freePort() -> Int {
    let socketFD = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(socketFD) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = 0
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(socketFD, $0, length) } }
    _ = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(socketFD, $0, &length) }
    }
    return Int(UInt16(bigEndian: address.sin_port))
}
