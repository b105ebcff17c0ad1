import Foundation
import Testing

/// `siwa dev` stops everything it started (PostgreSQL, the fake Apple, the receiver, the worker) and
/// deletes its folders under `$TMPDIR` however it is ended: SIGINT, SIGTERM, SIGHUP, the reader of its
/// output going away, and SIGKILL (then its watchdog does it). The process tree is read from /proc.
@Suite(.serialized) struct DevCleanupTests {
    enum Ending: String, CaseIterable, CustomStringConvertible {
        case interrupt, terminate, hangUp, closedPipe, kill
        var description: String { rawValue }
        var signal: Int32? {
            switch self {
            case .interrupt: SIGINT
            case .terminate: SIGTERM
            case .hangUp: SIGHUP
            case .closedPipe: nil
            case .kill: SIGKILL
            }
        }
    }

    @Test(arguments: Ending.allCases) func leavesNothingBehind(_ ending: Ending) async throws {
        let temporary = FileManager.default.temporaryDirectory.appendingPathComponent("siwa-dev-cleanup-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: temporary, withIntermediateDirectories: true)
        chmod(temporary.path, 0o755)  // the server user (postgres, under root) must reach its folder
        defer { try? FileManager.default.removeItem(at: temporary) }
        let dev = try DevUnderTest(temporary: temporary.path)
        defer { dev.forceStop() }
        try await dev.waitForBanner()

        let folders = try FileManager.default.contentsOfDirectory(atPath: temporary.path)
        #expect(folders.contains { $0.hasPrefix("siwa-dev-") } && folders.contains { $0.hasPrefix("siwa-pg-") }, "\(folders)")
        let server = try #require(Self.postmasterPID(in: temporary.path), "no postmaster.pid under \(temporary.path)")
        let children = ProcessTree.children(of: dev.pid)
        // fake Apple, receiver, worker, and the watchdog.
        #expect(children.count >= 4, "\(children.map(ProcessTree.commandLine))")
        let started = children + [server]
        #expect(started.allSatisfy(ProcessTree.isAlive))

        if let signal = ending.signal { kill(dev.pid, signal) } else { dev.closeOutput() }

        // Bounded: the contract gives SIGKILL 10 s; the orderly stops take about as long.
        let deadline = ContinuousClock.now + .seconds(ending == .kill ? 10 : 30)
        while ContinuousClock.now < deadline {
            let left = (try? FileManager.default.contentsOfDirectory(atPath: temporary.path)) ?? []
            if !started.contains(where: ProcessTree.isAlive), left.isEmpty, !dev.isRunning { break }
            try await Task.sleep(for: .milliseconds(100))
        }
        let alive = started.filter(ProcessTree.isAlive).map(ProcessTree.commandLine)
        #expect(alive.isEmpty, "\(ending): still running: \(alive)")
        let left = (try? FileManager.default.contentsOfDirectory(atPath: temporary.path)) ?? []
        #expect(left.isEmpty, "\(ending): left in TMPDIR: \(left)")
        #expect(!dev.isRunning)
    }

    /// None of dev's descriptors is held by a service it started: a socket dev closed but a child
    /// still held would never reach its peer as closed (as pg_ctl's server once did with the
    /// tests' sockets). A child's stdin/out/err are its own pipe from dev, not counted.
    @Test func itsServicesHoldNoneOfItsDescriptors() async throws {
        let temporary = FileManager.default.temporaryDirectory.appendingPathComponent("siwa-dev-fds-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: temporary, withIntermediateDirectories: true)
        chmod(temporary.path, 0o755)
        defer { try? FileManager.default.removeItem(at: temporary) }
        let dev = try DevUnderTest(temporary: temporary.path)
        defer { dev.forceStop() }
        try await dev.waitForBanner()

        let devHolds = ProcessTree.descriptorTargets(of: dev.pid)
        #expect(!devHolds.isEmpty, "dev's descriptors could not be read")
        let children = ProcessTree.children(of: dev.pid)
        #expect(children.count >= 4, "\(children.map(ProcessTree.commandLine))")
        for child in children {
            let shared = ProcessTree.descriptorTargets(of: child).intersection(devHolds)
            #expect(shared.isEmpty, "\(ProcessTree.commandLine(child)) holds dev's \(shared.sorted())")
        }
        kill(dev.pid, SIGTERM)
        try await waitUntil("siwa dev has stopped") { !dev.isRunning }
    }

    static func postmasterPID(in temporary: String) -> Int32? {
        let folders = (try? FileManager.default.contentsOfDirectory(atPath: temporary)) ?? []
        for folder in folders where folder.hasPrefix("siwa-pg-") {
            let path = temporary + "/" + folder + "/data/postmaster.pid"
            if let text = try? String(contentsOfFile: path, encoding: .utf8), let first = text.split(separator: "\n").first {
                return Int32(first)
            }
        }
        return nil
    }
}

/// `siwa dev` with its output on a pipe the test reads (and can close), in a `TMPDIR` of its own.
final class DevUnderTest: @unchecked Sendable {
    // @unchecked: touched only from the test's own task.
    private let process = Process()
    private let output = Pipe()

    init(temporary: String) throws {
        process.executableURL = try Siwa.binary()
        process.arguments = ["dev"]
        process.environment = ServiceProcess.childEnvironment([
            "TMPDIR": temporary, "SIWA_LISTEN": "127.0.0.1:\(freePort())", "SIWA_OPS_LISTEN": "127.0.0.1:\(freePort())",
            "SIWA_APP_API_LISTEN": "127.0.0.1:\(freePort())", "SIWA_DEV_EXIT_AFTER": "120",
            "HOME": ProcessInfo.processInfo.environment["HOME"] ?? "/tmp",
        ])
        process.standardOutput = output
        process.standardError = FileHandle(forWritingAtPath: "/dev/null")
        process.standardInput = FileHandle.nullDevice
        try process.run()
    }

    var pid: Int32 { process.processIdentifier }
    var isRunning: Bool { process.isRunning }
    private var seen = ""

    /// Reads the output (without blocking a thread for long) until the banner's last line.
    func waitForBanner(timeout: Duration = .seconds(90)) async throws {
        let handle = output.fileHandleForReading
        let descriptor = handle.fileDescriptor
        _ = fcntl(descriptor, F_SETFL, fcntl(descriptor, F_GETFL) | O_NONBLOCK)
        let deadline = ContinuousClock.now + timeout
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while !seen.contains(" status\n") {
            let count = read(descriptor, &buffer, buffer.count)
            if count > 0 {
                seen += String(decoding: buffer[0..<count], as: UTF8.self)
                continue
            }
            guard process.isRunning, ContinuousClock.now < deadline else {
                throw ServiceProcessError(message: "siwa dev printed no banner:\n\(seen)")
            }
            try await Task.sleep(for: .milliseconds(50))
        }
    }

    /// As `siwa dev | head -1` does once it has its line.
    func closeOutput() { try? output.fileHandleForReading.close() }

    func forceStop() {
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
    }
}

/// Processes as /proc shows them.
enum ProcessTree {
    static func children(of parent: Int32) -> [Int32] {
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        return entries.compactMap(Int32.init).filter { parentPID(of: $0) == parent }
    }

    /// What `pid`'s descriptors above stderr point at (`socket:[inode]`, `pipe:[inode]`, a path),
    /// without the kinds two processes name alike without sharing anything (`/dev/null`,
    /// `anon_inode:`: each epoll or eventfd is its own).
    static func descriptorTargets(of pid: Int32) -> Set<String> {
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd")) ?? []
        return Set(
            entries.filter { (Int32($0) ?? 0) > 2 }
                .compactMap { try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/fd/\($0)") }
                .filter { $0 != "/dev/null" && !$0.hasPrefix("anon_inode:") })
    }

    /// The 4th field of /proc/PID/stat (after the command name in parentheses).
    static func parentPID(of pid: Int32) -> Int32? {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let close = stat.lastIndex(of: ")")
        else { return nil }
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        return fields.count > 1 ? Int32(fields[1]) : nil
    }

    /// Running (a zombie has ended: it only waits for its parent to read its status).
    static func isAlive(_ pid: Int32) -> Bool {
        guard kill(pid, 0) == 0, let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let close = stat.lastIndex(of: ")")
        else { return false }
        return stat[stat.index(after: close)...].split(separator: " ").first != "Z"
    }

    static func commandLine(_ pid: Int32) -> String {
        let data = FileManager.default.contents(atPath: "/proc/\(pid)/cmdline") ?? Data()
        return "\(pid) " + String(decoding: data.map { $0 == 0 ? 32 : $0 }, as: UTF8.self)
    }
}
