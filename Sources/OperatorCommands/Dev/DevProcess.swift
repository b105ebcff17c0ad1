import Foundation
import LocalPostgres
import Locking

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A child of `siwa dev`: spawned in its own process group (so the terminal's Ctrl-C reaches only
/// `siwa dev`, which then stops the children in order), stdout and stderr read line by line on a
/// dedicated thread and handed to `onLine`.
final class DevProcess: Sendable {
    let name: String
    let pid: pid_t
    private let exitStatus = Locked<Int32?>(nil)

    /// Starts `executable` with `arguments` and exactly `environment`.
    init(
        name: String, executable: String, arguments: [String], environment: [String: String],
        onLine: @escaping @Sendable (String) -> Void
    ) throws {
        self.name = name
        var pipeFDs: [Int32] = [0, 0]
        guard pipe(&pipeFDs) == 0 else { throw DevError("\(name): pipe failed (errno \(errno))") }
        let (readEnd, writeEnd) = (pipeFDs[0], pipeFDs[1])
        // Close-on-exec: another child must not hold this child's pipe open.
        _ = fcntl(readEnd, F_SETFD, FD_CLOEXEC)
        _ = fcntl(writeEnd, F_SETFD, FD_CLOEXEC)

        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, writeEnd, 1)
        posix_spawn_file_actions_adddup2(&actions, writeEnd, 2)
        // Nothing else of ours goes along (the pipe's ends are close-on-exec already): a service
        // holding one of dev's sockets keeps it open after dev closed it.
        for descriptor in InheritedDescriptors.aboveStandardError() {
            posix_spawn_file_actions_addclose(&actions, descriptor)
        }

        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        // Own process group; default dispositions for the signals `siwa dev` ignores; empty mask.
        posix_spawnattr_setpgroup(&attributes, 0)
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for signal in [SIGINT, SIGTERM, SIGPIPE, SIGHUP] { sigaddset(&defaults, signal) }
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        var mask = sigset_t()
        sigemptyset(&mask)
        posix_spawnattr_setsigmask(&attributes, &mask)
        posix_spawnattr_setflags(
            &attributes, Int16(POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK))

        let argv: [UnsafeMutablePointer<CChar>?] = ([executable] + arguments).map { strdup($0) } + [nil]
        let envp: [UnsafeMutablePointer<CChar>?] =
            environment.sorted { $0.key < $1.key }.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            argv.forEach { free($0) }
            envp.forEach { free($0) }
        }
        var pid: pid_t = 0
        let result = posix_spawn(&pid, executable, &actions, &attributes, argv, envp)
        close(writeEnd)
        guard result == 0 else {
            close(readEnd)
            throw DevError("could not start \(executable): \(String(cString: strerror(result)))")
        }
        self.pid = pid
        // Stopped by the orphan reaper should `siwa dev` be killed outright.
        OrphanReaper.shared?.watch(pid: pid)
        Thread.detachNewThread { Self.readLines(readEnd, onLine) }
    }

    /// The exit status once the child has ended (128+signal when killed), nil while it runs.
    var status: Int32? {
        exitStatus.withLock { saved in
            if let saved { return saved }
            var raw: Int32 = 0
            let result = waitpid(pid, &raw, WNOHANG)
            guard result == pid else { return nil }
            let signal = raw & 0x7f
            saved = signal == 0 ? (raw >> 8) & 0xff : 128 + signal
            OrphanReaper.shared?.forget(pid: pid)
            return saved
        }
    }

    var isRunning: Bool { status == nil }

    func send(_ signal: Int32) {
        if isRunning { _ = kill(pid, signal) }
    }

    /// SIGTERM, up to `grace` for it to end, then SIGKILL. Returns the exit status.
    @discardableResult
    func stop(grace: Duration) async -> Int32? {
        send(SIGTERM)
        let deadline = ContinuousClock.now + grace
        while isRunning && ContinuousClock.now < deadline { try? await Task.sleep(for: .milliseconds(50)) }
        if isRunning {
            send(SIGKILL)
            while isRunning { try? await Task.sleep(for: .milliseconds(20)) }
        }
        return status
    }

    static func readLines(_ fd: Int32, _ onLine: @Sendable (String) -> Void) {
        defer { close(fd) }
        var pending: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        while true {
            let count = read(fd, &buffer, buffer.count)
            if count < 0 && errno == EINTR { continue }
            if count <= 0 { break }
            pending += buffer[0..<count]
            while let newline = pending.firstIndex(of: UInt8(ascii: "\n")) {
                onLine(String(decoding: pending[..<newline], as: UTF8.self))
                pending.removeSubrange(...newline)
            }
        }
        if !pending.isEmpty { onLine(String(decoding: pending, as: UTF8.self)) }
    }
}

struct DevError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// Ports for the listeners `siwa dev` starts.
enum DevPorts {
    /// True when nothing listens on host:port (we could bind it).
    static func isFree(host: String, port: Int) -> Bool {
        bind(host: host, port: port) != nil
    }

    /// A port the kernel just handed out (free at the time of asking).
    static func free(host: String = "127.0.0.1") -> Int? {
        bind(host: host, port: 0)
    }

    private static func bind(host: String, port: Int) -> Int? {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        guard inet_pton(AF_INET, host == "0.0.0.0" || host == "localhost" ? "127.0.0.1" : host, &address.sin_addr) == 1
        else { return nil }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.bind(fd, $0, length) }
        }
        guard bound == 0 else { return nil }
        let named = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        guard named == 0 else { return nil }
        return Int(UInt16(bigEndian: address.sin_port))
    }
}
