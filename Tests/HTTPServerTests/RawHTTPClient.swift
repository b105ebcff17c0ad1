#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import TestTiming

/// A blocking TCP client for what an HTTP client will not do: half requests, lying Content-Length,
/// hand-written chunked bodies.
///
/// `@unchecked Sendable`: each test uses its client from one task at a time.
final class RawHTTPClient: @unchecked Sendable {
    /// -1 once closed: a second close(2) could close another test's socket that got the number.
    private(set) var fd: Int32

    /// `receiveTimeout` (seconds, times `TestTimeScale`) bounds each read: a server that never answers.
    init(port: Int, receiveTimeout unscaled: Double = 5) throws {
        let receiveTimeout = TestTimeScale.scaled(seconds: unscaled)
        #if canImport(Glibc)
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        #else
        fd = socket(AF_INET, SOCK_STREAM, 0)
        #endif
        guard fd >= 0 else { throw RawError(message: "socket errno \(errno)") }
        var timeout = timeval(tv_sec: Int(receiveTimeout), tv_usec: Int((receiveTimeout.truncatingRemainder(dividingBy: 1)) * 1_000_000))
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard result == 0 else {
            close(fd)
            fd = -1
            throw RawError(message: "connect errno \(errno)")
        }
    }

    deinit { if fd >= 0 { close(fd) } }

    /// Closes the connection now (the client has gone).
    func hangUp() {
        if fd >= 0 { close(fd) }
        fd = -1
    }

    func send(_ text: String) { send(Array(text.utf8)) }

    func send(_ bytes: [UInt8]) {
        var offset = 0
        while offset < bytes.count {
            let sent = bytes.withUnsafeBytes {
                Glibc.send(fd, $0.baseAddress! + offset, bytes.count - offset, Int32(MSG_NOSIGNAL))
            }
            if sent <= 0 { return }
            offset += sent
        }
    }

    enum ReadEnd: Equatable { case closed, timedOut, error }

    /// `readBlocking(until:)` on its own thread, so that a blocking `recv` holds no shared pool.
    func read(until done: @escaping @Sendable (String) -> Bool = { _ in false }) async -> (text: String, end: ReadEnd) {
        await onOwnThread { self.readBlocking(until: done) }
    }

    /// Reads until the peer closes, the timeout passes, or `until` matches what was read so far.
    func readBlocking(until done: (String) -> Bool) -> (text: String, end: ReadEnd) {
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count == 0 { return (String(decoding: received, as: UTF8.self), .closed) }
            if count < 0 {
                let end: ReadEnd = (errno == EAGAIN || errno == EWOULDBLOCK) ? .timedOut : .error
                return (String(decoding: received, as: UTF8.self), end == .error && errno == ECONNRESET ? .closed : end)
            }
            received += buffer[0..<count]
            let text = String(decoding: received, as: UTF8.self)
            if done(text) { return (text, .closed) }
        }
    }
}

struct RawError: Error { var message: String }
