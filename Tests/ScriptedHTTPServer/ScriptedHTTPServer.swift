#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif
import Foundation
import TestTiming

/// A TCP server on 127.0.0.1 that reads each request (head and Content-Length body) and writes
/// the bytes `script` gives for it (numbered across connections), then closes if told to. Over TLS
/// when given a certificate (`tls:`); `greeting:` is written as soon as a connection is accepted,
/// before any handshake (plain bytes to a TLS client: a handshake that fails).
package final class ScriptedHTTPServer: @unchecked Sendable {
    // @unchecked: the listening descriptor is set once; all shared state is behind `state`'s lock.
    package enum Reply: Sendable {
        case answer(String, thenClose: Bool = false)
        /// Never answers (the client's timeout ends it).
        case silent
        /// Closes the connection without a byte of answer.
        case closeWithoutAnswer
        /// Answers once the gate is open (`openGate()`; at most 60 s later, times `TestTimeScale`).
        case heldUntilGateOpens(String)
        /// The head, then `bodyBytes` bytes of body ("x"), stopping early when the client goes.
        case endless(head: String, bodyBytes: Int)
        /// `head` at once, then the text one byte at a time, `interval` apart, stopping early when
        /// the client goes.
        case trickle(String, interval: Duration, afterHead: String = "")
        /// The text, then a reset (RST) instead of an orderly close.
        case answerThenReset(String)
    }

    private struct State {
        var accepted = 0
        var closed = 0
        var heads: [String] = []
        var bodies: [String] = []
        var descriptors: [Int32] = []
        var gateOpen = false
        var held = 0
        var mostHeld = 0
        var stopped = false
    }

    package let port: Int
    private let listener: Int32
    private let state = LockedState(State())
    private let script: @Sendable (Int) -> Reply
    private let tls: TLSServerContext?
    private let greeting: String?

    package init(tls fixture: TLSFixture? = nil, greeting: String? = nil, script: @escaping @Sendable (Int) -> Reply) throws {
        self.script = script
        self.greeting = greeting
        tls = try fixture.map(TLSServerContext.init)
        // Close-on-exec, as every socket here: a process another test starts meanwhile must not hold
        // a connection open after this server closed (or reset) it.
        let socketFD = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        guard withUnsafePointer(to: &address, { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(socketFD, $0, length) } }) == 0,
            listen(socketFD, 16) == 0,
            withUnsafeMutablePointer(to: &address, {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(socketFD, $0, &length) }
            }) == 0
        else {
            close(socketFD)
            throw CocoaError(.fileWriteUnknown)
        }
        listener = socketFD
        port = Int(UInt16(bigEndian: address.sin_port))
        let listening = socketFD
        Thread.detachNewThread { [self] in
            while true {
                let connection = accept(listening, nil, nil)
                if connection >= 0 { _ = fcntl(connection, F_SETFD, FD_CLOEXEC) }
                // A signal, a client gone before its turn, a full descriptor table: try again. Only
                // stop()'s shutdown ends the loop (closing the listener on a passing error freed its
                // port for another test's server, whose answer, or silence, a client then got).
                if connection < 0, !state.withLock({ $0.stopped }), [EINTR, ECONNABORTED, EMFILE, ENFILE, ENOBUFS, ENOMEM, EPROTO].contains(errno) {
                    if errno != EINTR && errno != ECONNABORTED { usleep(10_000) }
                    continue
                }
                guard connection >= 0 else {
                    // stop() shut it down; closed here, so no other test's socket can reuse the
                    // number while this thread still uses it.
                    close(listening)
                    return
                }
                state.withLock {
                    $0.accepted += 1
                    $0.descriptors.append(connection)
                }
                Thread.detachNewThread { [self] in serve(connection) }
            }
        }
    }

    package var accepted: Int { state.withLock { $0.accepted } }
    /// The ALPN protocols each TLS client offered (in TLS mode).
    package var alpnOffers: [[String]] { tls?.alpnOffers ?? [] }
    package var heads: [String] { state.withLock { $0.heads } }
    package var bodies: [String] { state.withLock { $0.bodies } }

    /// Shuts the sockets down; each is closed by the thread using it (a number closed here could
    /// be reused by a parallel test's socket while that thread still reads from it).
    package func stop() {
        state.withLock { $0.stopped = true }
        shutdown(listener, Int32(SHUT_RDWR))
        state.withLock { state in
            for descriptor in state.descriptors { shutdown(descriptor, Int32(SHUT_RDWR)) }
        }
    }

    package func openGate() { state.withLock { $0.gateOpen = true } }

    /// Holds the next `.heldUntilGateOpens` answers again, until the next `openGate()`.
    package func closeGate() { state.withLock { $0.gateOpen = false } }

    /// The most requests held unanswered at the same time.
    package var mostHeldAtOnce: Int { state.withLock { $0.mostHeld } }

    /// Waits (30 s at most, times `TestTimeScale`) until `count` requests were read.
    package func waitForRequests(_ count: Int) async throws {
        try await waitUntil("\(count) requests were read", timeout: .seconds(30), every: .milliseconds(10)) {
            state.withLock { $0.heads.count } >= count
        }
    }

    /// Waits (10 s at most, times `TestTimeScale`) until `count` connections were closed by the server.
    package func waitForClosed(_ count: Int) async throws {
        try await waitUntil("the server closed \(count) connections", timeout: .seconds(10), every: .milliseconds(10)) {
            state.withLock { $0.closed } >= count
        }
    }

    private func serve(_ connection: Int32) {
        var buffered: [UInt8] = []
        var secured: TLSConnection?
        func fill() -> Bool {
            var chunk = [UInt8](repeating: 0, count: 4096)
            let count = chunk.withUnsafeMutableBytes { buffer in
                secured.map { $0.read(into: buffer) } ?? recv(connection, buffer.baseAddress, buffer.count, 0)
            }
            guard count > 0 else { return false }
            buffered += chunk[0..<count]
            return true
        }
        func write(_ bytes: [UInt8]) -> Bool {
            var sent = 0
            while sent < bytes.count {
                let count = bytes[sent...].withUnsafeBytes { buffer in
                    secured.map { $0.write(buffer) } ?? send(connection, buffer.baseAddress, buffer.count, Int32(MSG_NOSIGNAL))
                }
                guard count > 0 else { return false }
                sent += count
            }
            return true
        }
        defer {
            state.withLock { state in
                // Under the lock: stop() never shuts down a number this has given back.
                state.descriptors.removeAll { $0 == connection }
                close(connection)
                state.closed += 1
            }
        }
        if let greeting {
            _ = write(Array(greeting.utf8))
            return
        }
        if let tls {
            guard let connection = tls.accept(connection) else { return }
            secured = connection
        }
        defer { secured = nil }
        while true {
            var end = buffered.firstRange(of: [13, 10, 13, 10])
            while end == nil {
                guard fill() else { return }
                end = buffered.firstRange(of: [13, 10, 13, 10])
            }
            let head = String(decoding: buffered[..<end!.upperBound], as: UTF8.self)
            buffered.removeFirst(end!.upperBound)
            let length = head.lowercased().split(separator: "\r\n").first { $0.hasPrefix("content-length:") }
                .flatMap { Int($0.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces)) } ?? 0
            while buffered.count < length { guard fill() else { return } }
            let body = String(decoding: buffered[..<length], as: UTF8.self)
            buffered.removeFirst(length)
            let index = state.withLock { state -> Int in
                state.heads.append(head)
                state.bodies.append(body)
                return state.heads.count - 1
            }
            switch script(index) {
            case .silent:
                while fill() {}
                return
            case .closeWithoutAnswer:
                return
            case .heldUntilGateOpens(let text):
                state.withLock { state in
                    state.held += 1
                    state.mostHeld = max(state.mostHeld, state.held)
                }
                // Held at most 60 s (scaled), then answered anyway: a bound for a test that never opens it.
                try? waitUntilBlocking("the gate opened", timeout: .seconds(60)) { state.withLock { $0.gateOpen } }
                state.withLock { $0.held -= 1 }
                _ = write(Array(text.utf8))
            case .answer(let text, let thenClose):
                _ = write(Array(text.utf8))
                if thenClose { return }
            case .endless(let head, let bodyBytes):
                guard write(Array(head.utf8)) else { return }
                let chunk = [UInt8](repeating: UInt8(ascii: "x"), count: 64 << 10)
                var sent = 0
                while sent < bodyBytes, write(Array(chunk.prefix(bodyBytes - sent))) { sent += chunk.count }
                return
            case .trickle(let text, let interval, let head):
                guard write(Array(head.utf8)) else { return }
                for byte in text.utf8 {
                    guard write([byte]) else { return }
                    usleep(UInt32(interval / .microseconds(1)))
                }
            case .answerThenReset(let text):
                _ = write(Array(text.utf8))
                // Time for the bytes to reach the client before the reset, which would discard
                // them unread from its socket.
                usleep(200_000)
                // SO_LINGER 0: close(2) sends RST, as a crashed peer or a middlebox would.
                var linger = linger(l_onoff: 1, l_linger: 0)
                setsockopt(connection, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<linger>.size))
                return
            }
        }
    }
}

/// A value behind an NSLock (test support depends on no module of the package).
private final class LockedState<Value>: @unchecked Sendable {
    // @unchecked: `value` is only touched while `lock` is held.
    private let lock = NSLock()
    private var value: Value

    init(_ value: Value) { self.value = value }

    func withLock<T>(_ body: (inout Value) -> T) -> T {
        lock.lock()
        defer { lock.unlock() }
        return body(&value)
    }
}
