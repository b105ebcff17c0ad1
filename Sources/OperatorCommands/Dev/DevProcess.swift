import ChildProcesses
import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A child of `siwa dev`: a `ChildProcess` in its own process group (so the terminal's Ctrl-C
/// reaches only `siwa dev`, which then stops the children in order), stdout and stderr read line by
/// line on a dedicated thread and handed to `onLine`.
final class DevProcess: Sendable {
    let name: String
    private let child: ChildProcess

    /// Starts `executable` with `arguments` and exactly `environment`.
    init(
        name: String, executable: String, arguments: [String], environment: [String: String],
        onLine: @escaping @Sendable (String) -> Void
    ) throws {
        self.name = name
        do {
            child = try ChildProcess(
                executable, arguments,
                options: .init(environment: environment, output: .pipe, error: .sameAsOutput, ownProcessGroup: true))
        } catch {
            throw DevError("\(name): \(error)")
        }
        if let output = child.takeOutputDescriptor() { Thread.detachNewThread { Self.readLines(output, onLine) } }
    }

    var pid: Int32 { child.pid }
    /// The exit status once the child has ended (128+signal when killed), nil while it runs.
    var status: Int32? { child.exitCode }
    var isRunning: Bool { child.isRunning }

    func send(_ signal: Int32) { child.signal(signal) }

    /// SIGTERM, up to `grace` for it to end, then SIGKILL. Returns the exit status.
    @discardableResult
    func stop(grace: Duration) async -> Int32? { await child.stop(grace: grace)?.code }

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

/// Whether a default port of `siwa dev` (8080, 9090, 8081) is free: when it is not, the listener
/// gets port 0 and dev reads back the one its child bound (`DevListener`).
enum DevPorts {
    /// True when nothing listens on host:port (we could bind it).
    static func isFree(host: String, port: Int) -> Bool {
        bind(host: host, port: port) != nil
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
