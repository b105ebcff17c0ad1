#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif
internal import Dispatch
internal import Foundation
import Locking

/// POSTs to an `http://` endpoint on a loopback address (the only plain-HTTP endpoints
/// `SIWA_WEBHOOK_URL` accepts: a receiver on the same host) over keep-alive HTTP/1.1 connections of
/// our own, each exchange a few blocking calls on a thread of its own (see `send`).
///
/// Why not URLSession here: on Linux each of its requests goes through curl handles, dispatch
/// sources, timers and several thread hops. Measured by `deploy/bench/webhooks.sh`, that was about
/// 300 µs of worker CPU per delivery, two thirds of what a delivery cost the whole machine (sink
/// and PostgreSQL included). `https://` endpoints still go through URLSession (TLS and certificate
/// checks are its job, not ours).
///
/// Every exchange is bounded by the timeout (connect, write and read share one deadline); a
/// redirect is an answer like any other (never followed); the answer's body is read in full (so
/// the connection can be reused) and its first 512 bytes kept.
final class LoopbackHTTPTransport: Sendable {
    /// Largest answer head, and largest body read to keep a connection (a longer body closes it).
    static let maximumHeadBytes = 64 * 1024
    static let maximumKeptBodyBytes = 1 << 20

    /// Where to connect, in order: `localhost` is 127.0.0.1, then ::1 (a receiver may listen on either).
    private let addresses: [LoopbackAddress]
    private let requestTarget: String
    private let hostHeader: String
    private let timeout: Duration
    private let idle = Locked<[LoopbackHTTPConnection]>([])

    /// nil unless `url` is `http://` to a numeric loopback address or `localhost`.
    init?(url: URL, timeout: Duration) {
        guard url.scheme?.lowercased() == "http", let components = URLComponents(url: url, resolvingAgainstBaseURL: false),
            let host = components.host
        else { return nil }
        let names = host.lowercased() == "localhost" ? ["127.0.0.1", "::1"] : [host]
        let addresses = names.compactMap { LoopbackAddress(host: $0, port: components.port ?? 80) }
        guard addresses.count == names.count else { return nil }
        self.addresses = addresses
        let path = components.percentEncodedPath.isEmpty ? "/" : components.percentEncodedPath
        requestTarget = components.percentEncodedQuery.map { "\(path)?\($0)" } ?? path
        hostHeader = components.port.map { "\(url.host ?? host):\($0)" } ?? (url.host ?? host)
        self.timeout = timeout
    }

    deinit {
        for connection in idle.withLock({ $0 }) { connection.close() }
    }

    func send(body: [UInt8], headers: [(String, String)]) async -> WebhookAttemptResult {
        var head = "POST \(requestTarget) HTTP/1.1\r\nHost: \(hostHeader)\r\nContent-Type: application/json\r\n"
            + "User-Agent: siwa-notifications-webhooks\r\nContent-Length: \(body.count)\r\n"
        for (name, value) in headers { head += "\(name): \(value)\r\n" }
        let request = Array((head + "\r\n").utf8) + body
        let deadline = ContinuousClock.now + timeout
        // A serial queue of its own per exchange: it runs on libdispatch's overcommit pool, which
        // adds a thread whenever the others are busy, so exchanges blocked on slow endpoints never
        // hold back the rest. (A concurrent queue, or the global one, runs on the pool sized to the
        // CPUs: two slow endpoints would stall every delivery, and every timer of the process.)
        // Never on the Swift concurrency pool either, for the same reason.
        return await withCheckedContinuation { continuation in
            DispatchQueue(label: "siwa.webhooks.http").async {
                continuation.resume(returning: self.exchange(request, deadline: deadline))
            }
        }
    }

    /// One request and its answer, blocking. A kept connection the server closed meanwhile (it
    /// answered nothing at all on it) is replaced once by a fresh one: nothing was answered, so
    /// sending again is a first attempt, not a repeat of a delivered change.
    private func exchange(_ request: [UInt8], deadline: ContinuousClock.Instant) -> WebhookAttemptResult {
        var reused = idle.withLock { $0.popLast() }
        while true {
            let connection: LoopbackHTTPConnection
            if let kept = reused, kept.isIdleAndOpen() {
                connection = kept
            } else {
                reused?.close()
                reused = nil
                do throws(LoopbackHTTPFailure) {
                    connection = try connect(deadline: deadline)
                } catch {
                    return error.result
                }
            }
            do throws(LoopbackHTTPFailure) {
                let answer = try connection.exchange(request, deadline: deadline)
                if answer.keepOpen {
                    idle.withLock { $0.append(connection) }
                } else {
                    connection.close()
                }
                return .answered(status: answer.status, bodyPrefix: String(decoding: answer.bodyPrefix, as: UTF8.self))
            } catch {
                connection.close()
                if reused != nil, error.nothingAnswered {
                    reused = nil
                    continue
                }
                return error.result
            }
        }
    }
}

extension LoopbackHTTPTransport {
    /// A new connection to the first address that does not refuse it.
    fileprivate func connect(deadline: ContinuousClock.Instant) throws(LoopbackHTTPFailure) -> LoopbackHTTPConnection {
        var failure = LoopbackHTTPFailure.connection(operation: "connect", code: ECONNREFUSED, bytesReceived: 0)
        for address in addresses {
            do throws(LoopbackHTTPFailure) {
                return try LoopbackHTTPConnection(to: address, deadline: deadline)
            } catch {
                guard case .connection(operation: "connect", let code, bytesReceived: _) = error,
                    code == ECONNREFUSED || code == EADDRNOTAVAIL
                else { throw error }
                failure = error
            }
        }
        throw failure
    }
}

/// Where a loopback endpoint listens: IPv4 127.0.0.0/8 (`localhost` is 127.0.0.1) or IPv6 ::1.
struct LoopbackAddress: Sendable {
    let family: Int32
    let storage: sockaddr_storage
    let length: socklen_t

    init?(host: String, port: Int) {
        guard (0...65535).contains(port) else { return nil }
        let name = host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
        var storage = sockaddr_storage()
        let isIPv4 = withUnsafeMutablePointer(to: &storage) { pointer in
            pointer.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { v4 in
                v4.pointee.sin_family = sa_family_t(AF_INET)
                v4.pointee.sin_port = in_port_t(UInt16(port).bigEndian)
                return inet_pton(AF_INET, name, &v4.pointee.sin_addr) == 1
            }
        }
        if isIPv4, name.hasPrefix("127.") {
            family = AF_INET
            length = socklen_t(MemoryLayout<sockaddr_in>.size)
        } else if name == "::1" {
            storage = sockaddr_storage()
            withUnsafeMutablePointer(to: &storage) { pointer in
                pointer.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { v6 in
                    v6.pointee.sin6_family = sa_family_t(AF_INET6)
                    v6.pointee.sin6_port = in_port_t(UInt16(port).bigEndian)
                    _ = inet_pton(AF_INET6, name, &v6.pointee.sin6_addr)
                }
            }
            family = AF_INET6
            length = socklen_t(MemoryLayout<sockaddr_in6>.size)
        } else {
            return nil
        }
        self.storage = storage
    }
}

/// Why an exchange got no answer.
enum LoopbackHTTPFailure: Error {
    case timedOut
    /// `operation` failed with `code` (an errno), or the peer closed (`code` nil).
    case connection(operation: String, code: Int32?, bytesReceived: Int)
    case malformedAnswer(String)

    var result: WebhookAttemptResult {
        switch self {
        case .timedOut: .timedOut
        case .connection(let operation, let code, _):
            .connectionFailed(detail: code.map { "\(operation): errno \($0)" } ?? "\(operation): closed by the endpoint")
        case .malformedAnswer(let problem): .connectionFailed(detail: "malformed answer: \(problem)")
        }
    }

    /// The peer closed or reset before a single byte of an answer.
    var nothingAnswered: Bool {
        if case .connection(let operation, _, let received) = self { return operation != "connect" && received == 0 }
        return false
    }
}

/// One non-blocking TCP connection used with poll(2) against a deadline, by one exchange at a time
/// (it is taken from the idle list before use and put back after).
final class LoopbackHTTPConnection: @unchecked Sendable {
    // @unchecked: owned by exactly one exchange at a time (see above); never shared while in use.
    private var descriptor: Int32
    private var buffered: [UInt8] = []

    init(to address: LoopbackAddress, deadline: ContinuousClock.Instant) throws(LoopbackHTTPFailure) {
        #if canImport(Glibc)
            let type = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        #else
            let type = SOCK_STREAM
        #endif
        descriptor = socket(address.family, type, 0)
        guard descriptor >= 0 else { throw .connection(operation: "socket", code: errno, bytesReceived: 0) }
        var one: Int32 = 1
        setsockopt(descriptor, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        var storage = address.storage
        let started = withUnsafePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(descriptor, $0, address.length) }
        }
        if started != 0 {
            guard errno == EINPROGRESS else {
                let code = errno
                close()
                throw .connection(operation: "connect", code: code, bytesReceived: 0)
            }
            do throws(LoopbackHTTPFailure) {
                try wait(for: Int16(POLLOUT), until: deadline)
            } catch {
                close()
                throw error
            }
            var failure: Int32 = 0
            var size = socklen_t(MemoryLayout<Int32>.size)
            getsockopt(descriptor, SOL_SOCKET, SO_ERROR, &failure, &size)
            guard failure == 0 else {
                close()
                throw .connection(operation: "connect", code: failure, bytesReceived: 0)
            }
        }
    }

    func close() {
        if descriptor >= 0 { closeDescriptor(descriptor) }
        descriptor = -1
    }

    /// A kept connection is worth reusing only while the peer has neither closed it nor sent anything.
    func isIdleAndOpen() -> Bool {
        guard descriptor >= 0 else { return false }
        var entry = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
        return poll(&entry, 1, 0) == 0
    }

    struct Answer {
        var status: Int
        var bodyPrefix: [UInt8]
        var keepOpen: Bool
    }

    func exchange(_ request: [UInt8], deadline: ContinuousClock.Instant) throws(LoopbackHTTPFailure) -> Answer {
        buffered = []
        try write(request, deadline: deadline)
        while true {
            let head = try readHead(deadline: deadline)
            // 1xx are interim (a 100 Continue we did not ask for): the real answer follows.
            if (100...199).contains(head.status) { continue }
            let (prefix, complete) = try readBody(of: head, deadline: deadline)
            return Answer(status: head.status, bodyPrefix: prefix, keepOpen: complete && !head.closes)
        }
    }

    private func wait(for events: Int16, until deadline: ContinuousClock.Instant) throws(LoopbackHTTPFailure) {
        while true {
            let left = deadline - ContinuousClock.now
            guard left > .zero else { throw .timedOut }
            let milliseconds = Int32(clamping: left.components.seconds * 1000 + left.components.attoseconds / 1_000_000_000_000_000 + 1)
            var entry = pollfd(fd: descriptor, events: events, revents: 0)
            let ready = poll(&entry, 1, milliseconds)
            if ready > 0 { return }
            if ready < 0, errno != EINTR { throw .connection(operation: "poll", code: errno, bytesReceived: buffered.count) }
        }
    }

    private func write(_ bytes: [UInt8], deadline: ContinuousClock.Instant) throws(LoopbackHTTPFailure) {
        var offset = 0
        while offset < bytes.count {
            let sent = bytes.withUnsafeBytes { send(descriptor, $0.baseAddress! + offset, bytes.count - offset, Int32(MSG_NOSIGNAL)) }
            if sent > 0 {
                offset += sent
            } else if sent < 0, errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR {
                try wait(for: Int16(POLLOUT), until: deadline)
            } else {
                throw .connection(operation: "send", code: errno, bytesReceived: 0)
            }
        }
    }

    /// Reads more into `buffered`; false at the peer's end of stream.
    private func fill(deadline: ContinuousClock.Instant) throws(LoopbackHTTPFailure) -> Bool {
        var chunk = [UInt8](repeating: 0, count: 16 * 1024)
        while true {
            let count = chunk.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, $0.count, 0) }
            if count > 0 {
                buffered += chunk[0..<count]
                return true
            }
            if count == 0 { return false }
            guard errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR else {
                throw .connection(operation: "recv", code: errno, bytesReceived: buffered.count)
            }
            try wait(for: Int16(POLLIN), until: deadline)
        }
    }

    private struct Head {
        var status: Int
        var contentLength: Int?
        var chunked: Bool
        var closes: Bool
    }

    private func readHead(deadline: ContinuousClock.Instant) throws(LoopbackHTTPFailure) -> Head {
        let separator: [UInt8] = [13, 10, 13, 10]
        var end = buffered.firstRange(of: separator)
        while end == nil {
            guard buffered.count <= LoopbackHTTPTransport.maximumHeadBytes else { throw .malformedAnswer("head too large") }
            guard try fill(deadline: deadline) else {
                throw .connection(operation: "recv", code: nil, bytesReceived: buffered.count)
            }
            end = buffered.firstRange(of: separator)
        }
        let text = String(decoding: buffered[..<end!.lowerBound], as: UTF8.self)
        buffered.removeFirst(end!.upperBound)
        let lines = text.split(separator: "\r\n", omittingEmptySubsequences: false)
        let status = lines.first?.split(separator: " ", maxSplits: 2) ?? []
        guard status.count >= 2, status[0].hasPrefix("HTTP/1."), status[1].count == 3, let code = Int(status[1]) else {
            throw .malformedAnswer("status line")
        }
        var head = Head(status: code, contentLength: nil, chunked: false, closes: status[0] == "HTTP/1.0")
        for line in lines.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { continue }
            let value = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces).lowercased()
            switch line[..<colon].lowercased() {
            case "content-length":
                guard let length = Int(value), length >= 0 else { throw .malformedAnswer("content-length") }
                head.contentLength = length
            case "transfer-encoding": head.chunked = value.hasSuffix("chunked")
            case "connection":
                if value.contains("close") { head.closes = true } else if value.contains("keep-alive") { head.closes = false }
            default: break
            }
        }
        return head
    }

    /// The body's first bytes, and whether it was read to its end (the connection can serve again).
    private func readBody(of head: Head, deadline: ContinuousClock.Instant) throws(LoopbackHTTPFailure) -> ([UInt8], Bool) {
        if head.status == 204 || head.status == 304 { return ([], true) }
        var prefix: [UInt8] = []
        func keep(_ bytes: ArraySlice<UInt8>) { if prefix.count < 512 { prefix += bytes.prefix(512 - prefix.count) } }
        if head.chunked {
            var total = 0
            while true {
                let line = try readLine(deadline: deadline)
                guard let size = Int(line.split(separator: ";").first ?? "", radix: 16), size >= 0 else {
                    throw .malformedAnswer("chunk size")
                }
                if size == 0 {
                    while try !readLine(deadline: deadline).isEmpty {}  // trailers, then the empty line
                    return (prefix, true)
                }
                total += size
                guard total <= LoopbackHTTPTransport.maximumKeptBodyBytes else { return (prefix, false) }
                while buffered.count < size + 2 {
                    guard try fill(deadline: deadline) else { return (prefix, false) }
                }
                keep(buffered[..<size])
                buffered.removeFirst(size + 2)
            }
        }
        if let length = head.contentLength {
            guard length <= LoopbackHTTPTransport.maximumKeptBodyBytes else { return (prefix, false) }
            while buffered.count < length {
                guard try fill(deadline: deadline) else { return (prefix, false) }
            }
            keep(buffered[..<length])
            buffered.removeFirst(length)
            return (prefix, true)
        }
        // Neither: the body runs to the end of the stream; the connection is done either way.
        while buffered.count < 512, try fill(deadline: deadline) {}
        keep(buffered[...])
        return (prefix, false)
    }

    private func readLine(deadline: ContinuousClock.Instant) throws(LoopbackHTTPFailure) -> String {
        while true {
            if let end = buffered.firstRange(of: [13, 10]) {
                let line = String(decoding: buffered[..<end.lowerBound], as: UTF8.self)
                buffered.removeFirst(end.upperBound)
                return line
            }
            guard buffered.count <= LoopbackHTTPTransport.maximumHeadBytes else { throw .malformedAnswer("line too long") }
            guard try fill(deadline: deadline) else { throw .malformedAnswer("answer cut short") }
        }
    }
}

/// close(2), out of reach of `LoopbackHTTPConnection.close()`'s name.
private func closeDescriptor(_ descriptor: Int32) { _ = close(descriptor) }
