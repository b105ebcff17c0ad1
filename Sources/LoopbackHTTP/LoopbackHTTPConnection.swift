#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif
internal import Foundation

/// One non-blocking TCP connection used with poll(2) against a deadline, by one exchange at a time
/// (a client takes it from its idle list before use and puts it back after).
final class LoopbackHTTPConnection: @unchecked Sendable {
    // @unchecked: owned by exactly one exchange at a time (see above); never shared while in use.

    /// Largest answer head (and chunk-size line).
    static let maximumHeadBytes = 64 * 1024
    /// Largest body read to its end so the connection can serve again (a longer one closes it).
    static let maximumReadBodyBytes = 1 << 20

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

    // Closed with its last reference too: a client dropped with idle connections leaks no descriptor.
    deinit { close() }

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

    /// Sends `request` and reads its answer, keeping the body's first `keptBodyBytes`; also says
    /// whether the connection can serve another exchange.
    func exchange(_ request: [UInt8], keptBodyBytes: Int, deadline: ContinuousClock.Instant) throws(LoopbackHTTPFailure)
        -> (answer: LoopbackHTTPAnswer, reusable: Bool)
    {
        buffered = []
        try write(request, deadline: deadline)
        while true {
            let head = try readHead(deadline: deadline)
            // 1xx are interim (a 100 Continue we did not ask for): the real answer follows.
            if (100...199).contains(head.status) { continue }
            var body = KeptBody(limit: keptBodyBytes)
            let readToItsEnd = try readBody(of: head, into: &body, deadline: deadline)
            let bodyEnd: LoopbackHTTPAnswer.BodyEnd = body.isLongerThanKept ? .longerThanKept : (body.cutShort ? .cutShort : .whole)
            return (LoopbackHTTPAnswer(status: head.status, body: body.bytes, bodyEnd: bodyEnd), readToItsEnd && !head.closes)
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
            guard buffered.count <= Self.maximumHeadBytes else { throw .malformedAnswer("head too large") }
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

    /// The body's first `limit` bytes, and whether there were more.
    private struct KeptBody {
        let limit: Int
        var bytes: [UInt8] = []
        var isLongerThanKept = false
        var cutShort = false

        mutating func keep(_ more: ArraySlice<UInt8>) {
            let room = limit - bytes.count
            if more.count > room { isLongerThanKept = true }
            if room > 0 { bytes += more.prefix(room) }
        }
    }

    /// Reads the body into `body`; true when it was read to its end (the connection can serve again).
    private func readBody(of head: Head, into body: inout KeptBody, deadline: ContinuousClock.Instant) throws(LoopbackHTTPFailure)
        -> Bool
    {
        if head.status == 204 || head.status == 304 { return true }
        if head.chunked {
            var total = 0
            while true {
                let line = try readLine(deadline: deadline)
                guard let size = Int(line.split(separator: ";").first ?? "", radix: 16), size >= 0 else {
                    throw .malformedAnswer("chunk size")
                }
                if size == 0 {
                    while try !readLine(deadline: deadline).isEmpty {}  // trailers, then the empty line
                    return true
                }
                total += size
                guard total <= Self.maximumReadBodyBytes else {
                    body.isLongerThanKept = true
                    return false
                }
                while buffered.count < size + 2 {
                    guard try fill(deadline: deadline) else {
                        body.keep(buffered.prefix(size))
                        body.cutShort = true
                        return false
                    }
                }
                body.keep(buffered[..<size])
                buffered.removeFirst(size + 2)
            }
        }
        if let length = head.contentLength {
            guard length <= Self.maximumReadBodyBytes else {
                body.isLongerThanKept = true
                return false
            }
            while buffered.count < length {
                guard try fill(deadline: deadline) else {
                    body.keep(buffered[...])
                    body.cutShort = true
                    return false
                }
            }
            body.keep(buffered[..<length])
            buffered.removeFirst(length)
            return true
        }
        // Neither: the body runs to the end of the stream; the connection is done either way.
        while buffered.count <= body.limit, try fill(deadline: deadline) {}
        body.keep(buffered[...])
        return false
    }

    private func readLine(deadline: ContinuousClock.Instant) throws(LoopbackHTTPFailure) -> String {
        while true {
            if let end = buffered.firstRange(of: [13, 10]) {
                let line = String(decoding: buffered[..<end.lowerBound], as: UTF8.self)
                buffered.removeFirst(end.upperBound)
                return line
            }
            guard buffered.count <= Self.maximumHeadBytes else { throw .malformedAnswer("line too long") }
            guard try fill(deadline: deadline) else { throw .malformedAnswer("answer cut short") }
        }
    }
}

/// close(2), out of reach of `LoopbackHTTPConnection.close()`'s name.
private func closeDescriptor(_ descriptor: Int32) { _ = close(descriptor) }
