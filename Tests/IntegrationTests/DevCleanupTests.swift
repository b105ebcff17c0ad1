import ChildProcesses
import Foundation
import Synchronization
import Testing
import TestTiming

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

        if let signal = ending.signal { #expect(dev.child.signal(signal)) } else { dev.child.closeOutput() }

        // Bounded: the contract gives SIGKILL 10 s; the orderly stops take about as long. The
        // expectations below say what was left if the wait ran out.
        try? await waitUntil("siwa dev and all it started are gone", timeout: .seconds(ending == .kill ? 10 : 30), every: .milliseconds(100)) {
            let left = (try? FileManager.default.contentsOfDirectory(atPath: temporary.path)) ?? []
            return !started.contains(where: ProcessTree.isAlive) && left.isEmpty && !dev.isRunning
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
        dev.child.signal(SIGTERM)
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
final class DevUnderTest: Sendable {
    let child: ChildProcess
    private let seen = Mutex("")

    init(temporary: String) throws {
        child = try ChildProcess(
            try Siwa.binary().path, ["dev"],
            options: .init(
                environment: ServiceProcess.childEnvironment([
                    "TMPDIR": temporary, "SIWA_LISTEN": "127.0.0.1:0", "SIWA_OPS_LISTEN": "127.0.0.1:0",
                    "SIWA_APP_API_LISTEN": "127.0.0.1:0", "SIWA_DEV_EXIT_AFTER": "120",
                    "HOME": ProcessInfo.processInfo.environment["HOME"] ?? "/tmp",
                ]), output: .pipe, error: .discard))
    }

    var pid: Int32 { child.pid }
    var isRunning: Bool { child.isRunning }

    /// Reads the output (never blocking a thread) until the banner's last line.
    func waitForBanner(timeout: Duration = .seconds(90)) async throws {
        try await waitUntil("siwa dev printed its banner", timeout: timeout, every: .milliseconds(50), detail: seen.withLock { $0 }) {
            while let bytes = child.readOutput(), !bytes.isEmpty {
                seen.withLock { $0 += String(decoding: bytes, as: UTF8.self) }
            }
            if seen.withLock({ $0.contains(" status\n") }) { return true }
            guard child.isRunning else { throw ServiceProcessError(message: "siwa dev exited before its banner:\n\(seen.withLock { $0 })") }
            return false
        }
    }

    /// SIGKILL while it is still our unreaped child, then the reap.
    func forceStop() {
        child.signal(SIGKILL)
        _ = child.waitForExitBlocking(timeout: .seconds(10))
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
        // Read from /proc only: no signal, not even 0, goes to a pid that is not our child.
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let close = stat.lastIndex(of: ")")
        else { return false }
        return stat[stat.index(after: close)...].split(separator: " ").first != "Z"
    }

    static func commandLine(_ pid: Int32) -> String {
        let data = FileManager.default.contents(atPath: "/proc/\(pid)/cmdline") ?? Data()
        return "\(pid) " + String(decoding: data.map { $0 == 0 ? 32 : $0 }, as: UTF8.self)
    }
}
