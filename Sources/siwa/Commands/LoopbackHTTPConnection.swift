#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif
import Foundation

/// One keep-alive HTTP/1.1 connection to a server on 127.0.0.1, used with blocking calls from a
/// thread of its own: the load driver of `siwa simulate sign-in --count`.
///
/// URLSession on Linux cost the driver more CPU per sign-in than the server it was measuring (its
/// own thread, dispatch hops and curl handles for every request), on the cores it shares with that
/// server. Plain HTTP on the loopback interface only: anything else goes through URLSession.
/// Answers must carry `Content-Length` (every server the driver talks to sends it).
final class LoopbackHTTPConnection {
    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    /// Longest wait for any read or write; a server that stalls longer fails the request.
    static let timeoutSeconds = 30
    /// Largest answer read (the driver's answers are a few hundred bytes).
    static let maximumAnswerBytes = 1 << 20

    let port: Int
    private var descriptor: Int32 = -1
    private var buffered: [UInt8] = []

    /// The port of `url`, when it is `http://127.0.0.1:PORT` or `http://localhost:PORT`.
    static func loopbackPort(of url: URL) -> Int? {
        guard url.scheme == "http", ["127.0.0.1", "localhost"].contains(url.host ?? ""), let port = url.port else { return nil }
        return port
    }

    init(port: Int) {
        self.port = port
    }

    deinit { disconnect() }

    /// POSTs `body` as JSON; the answer's status and body.
    func post(_ path: String, json body: [UInt8], bearer: String?) throws -> (status: Int, body: [UInt8]) {
        if descriptor < 0 { try open() }
        var head = "POST \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nContent-Type: application/json\r\n"
        if let bearer { head += "Authorization: Bearer \(bearer)\r\n" }
        head += "Content-Length: \(body.count)\r\n\r\n"
        do {
            try write(Array(head.utf8) + body)
            return try readAnswer()
        } catch {
            disconnect()
            throw error
        }
    }

    private func open() throws {
        #if canImport(Glibc)
            let socketFD = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        #else
            let socketFD = socket(AF_INET, SOCK_STREAM, 0)
        #endif
        guard socketFD >= 0 else { throw Failure(description: "socket: errno \(errno)") }
        var timeout = timeval(tv_sec: Self.timeoutSeconds, tv_usec: 0)
        setsockopt(socketFD, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(socketFD, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var noDelay: Int32 = 1
        setsockopt(socketFD, Int32(IPPROTO_TCP), TCP_NODELAY, &noDelay, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(socketFD, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else {
            let code = errno
            close(socketFD)
            throw Failure(description: "connect to 127.0.0.1:\(port): errno \(code)")
        }
        descriptor = socketFD
        buffered = []
    }

    private func disconnect() {
        if descriptor >= 0 { close(descriptor) }
        descriptor = -1
        buffered = []
    }

    private func write(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let sent = bytes.withUnsafeBytes { send(descriptor, $0.baseAddress! + offset, bytes.count - offset, Int32(MSG_NOSIGNAL)) }
            guard sent > 0 else { throw Failure(description: "send to 127.0.0.1:\(port): errno \(errno)") }
            offset += sent
        }
    }

    /// Reads more bytes into `buffered`; throws when the server closed or the wait ran out.
    private func fill() throws {
        var chunk = [UInt8](repeating: 0, count: 8192)
        let count = chunk.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, $0.count, 0) }
        guard count > 0 else {
            let reason = count == 0 ? "closed" : (errno == EAGAIN || errno == EWOULDBLOCK ? "timed out" : "errno \(errno)")
            throw Failure(description: "read from 127.0.0.1:\(port): \(reason)")
        }
        buffered += chunk[0..<count]
        guard buffered.count <= Self.maximumAnswerBytes else { throw Failure(description: "answer too large") }
    }

    private func readAnswer() throws -> (status: Int, body: [UInt8]) {
        let separator: [UInt8] = Array("\r\n\r\n".utf8)
        var headEnd: Int?
        while headEnd == nil {
            headEnd = buffered.firstRange(of: separator)?.lowerBound
            if headEnd == nil { try fill() }
        }
        let head = String(decoding: buffered[..<headEnd!], as: UTF8.self)
        buffered.removeFirst(headEnd! + separator.count)
        let lines = head.split(separator: "\r\n", omittingEmptySubsequences: false)
        let statusParts = lines.first?.split(separator: " ") ?? []
        guard statusParts.count >= 2, statusParts[0].hasPrefix("HTTP/1."), let status = Int(statusParts[1]) else {
            throw Failure(description: "not an HTTP/1.x answer")
        }
        var length: Int?
        var closes = statusParts[0] == "HTTP/1.0"
        for line in lines.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { continue }
            let name = line[..<colon].lowercased()
            let value = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
            switch name {
            case "content-length": length = Int(value)
            case "transfer-encoding": throw Failure(description: "chunked answers are not read here")
            case "connection": closes = value.lowercased() == "close" ? true : (value.lowercased() == "keep-alive" ? false : closes)
            default: break
            }
        }
        guard let length, length >= 0, length <= Self.maximumAnswerBytes else {
            throw Failure(description: "answer without a usable Content-Length")
        }
        while buffered.count < length { try fill() }
        let body = Array(buffered[..<length])
        buffered.removeFirst(length)
        if closes { disconnect() }
        return (status, body)
    }
}
