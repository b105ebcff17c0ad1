#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
internal import CMicroHTTPD
import Dispatch
import Logging
import Synchronization
import Locking

/// What libmicrohttpd's callbacks need, passed to them as `cls` (retained from start until
/// MHD_stop_daemon has returned). The callbacks are static members of this nonisolated type.
final class DaemonContext: Sendable {
    let handler: any HTTPHandler
    let logger: Logger
    let maxBodyBytes: Int
    /// Requests with a context alive (from the first byte of headers to completion).
    let activeRequests = Atomic<Int>(0)
    /// Connections accepted since the start.
    let connectionsAccepted = Atomic<Int>(0)
    /// Set during shutdown: every response asks the client to close its connection.
    let closingConnections = Atomic<Bool>(false)
    /// Set once the grace period is over: requests get 503 without reaching the handler.
    let rejectingRequests = Atomic<Bool>(false)
    /// Suspended requests (their handler has not answered yet), so that their work can be ended
    /// (deadline, client gone, shutdown) and shutdown can answer the ones the handler never did
    /// (stopping the daemon with a suspended connection is an API violation).
    private let suspended = Locked<[ObjectIdentifier: SuspendedRequest]>([:])
    /// Signalled when the last active request completes while the server is closing: what `stop()`
    /// waits on during the grace period.
    private let drained = DispatchSemaphore(value: 0)
    /// The last message from libmicrohttpd's log, for start-up errors.
    let lastDaemonMessage = Locked<String?>(nil)
    /// Open connections, by `MHD_Connection` address: their socket, and since when they have been
    /// waiting for a request to arrive whole (nil while one is being handled). Entries leave at
    /// libmicrohttpd's CLOSED notification, which comes before it closes the socket, so a socket
    /// found here under the lock is still this connection's.
    private let connections = Locked<[UInt: (socket: Int32, waitingSince: ContinuousClock.Instant?)]>([:])

    let connectionLimit: Int
    let onRefusal: (@Sendable (ConnectionRefusal, Int) -> Void)?
    let admit: (@Sendable (_ header: (String) -> String?) -> HTTPResponse?)?

    init(
        handler: any HTTPHandler, logger: Logger, maxBodyBytes: Int, connectionLimit: Int = .max,
        onRefusal: (@Sendable (ConnectionRefusal, Int) -> Void)? = nil,
        admit: (@Sendable (_ header: (String) -> String?) -> HTTPResponse?)? = nil
    ) {
        self.handler = handler
        self.logger = logger
        self.maxBodyBytes = maxBodyBytes
        self.connectionLimit = connectionLimit
        self.onRefusal = onRefusal
        self.admit = admit
    }

    /// Shuts down the socket of every connection that has waited longer than `deadline` for a
    /// request to arrive whole (libmicrohttpd then closes it): a client trickling a byte at a
    /// time resets the idle timeout forever, not this. Returns how many were cut off.
    func shutDownConnections(waitingLongerThan deadline: Duration) -> Int {
        let cutoff = ContinuousClock.now - deadline
        return connections.withLock { connections in
            var count = 0
            for (key, entry) in connections {
                guard let since = entry.waitingSince, since < cutoff else { continue }
                _ = shutdown(entry.socket, Int32(SHUT_RDWR))
                connections[key]?.waitingSince = nil
                count += 1
            }
            return count
        }
    }

    private func setWaiting(_ connection: OpaquePointer, since: ContinuousClock.Instant?) {
        let key = UInt(bitPattern: Int(bitPattern: UnsafeRawPointer(connection)))
        // Read, change, write back: `$0[key]?.waitingSince = since` made eight heap allocations a
        // call (Swift 6.3, optional chaining through Dictionary's subscript), twice per request.
        connections.withLock { connections in
            guard var entry = connections[key] else { return }
            entry.waitingSince = since
            connections[key] = entry
        }
    }

    func rememberSuspended(_ request: SuspendedRequest) {
        _ = suspended.withLock { $0.updateValue(request, forKey: ObjectIdentifier(request.request)) }
    }

    func forgetSuspended(_ request: RequestContext) {
        _ = suspended.withLock { $0.removeValue(forKey: ObjectIdentifier(request)) }
    }

    /// Answers every suspended request with `response` (which resumes them).
    func answerSuspended(with response: HTTPResponse) -> Int {
        let waiting = suspended.withLock { $0.values.map(\.request) }
        for request in waiting { request.complete(with: response) }
        return waiting.count
    }

    enum WorkEnding {
        /// `stop()`'s grace period is over: every request's work.
        case shutdown
        /// The watcher's pass: work running longer than the deadline (if any), or whose client has
        /// closed its connection.
        case deadlineOrClientGone(Duration?)
    }

    /// Ends the work of the suspended requests `why` names (each at most once), outside the lock;
    /// returns how many.
    func endSuspendedWork(_ why: WorkEnding) -> Int {
        let now = ContinuousClock.now
        let ending = suspended.withLock { suspended -> [@Sendable () -> Void] in
            var ending: [@Sendable () -> Void] = []
            for (key, var entry) in suspended {
                guard let endWork = entry.endWork else { continue }
                switch why {
                case .shutdown: break
                case .deadlineOrClientGone(let deadline):
                    let late = deadline.map { now - entry.since > $0 } ?? false
                    guard late || Self.clientHasGone(entry.socket) else { continue }
                }
                ending.append(endWork)
                entry.endWork = nil
                suspended[key] = entry
            }
            return ending
        }
        for endWork in ending { endWork() }
        return ending.count
    }

    /// The client closed its end (or the connection failed): a zero-timeout poll of the socket of
    /// a suspended connection, which libmicrohttpd itself does not watch.
    private static func clientHasGone(_ socket: Int32) -> Bool {
        guard socket >= 0 else { return false }
        var descriptor = pollfd(fd: socket, events: pollReadHangUp, revents: 0)
        guard poll(&descriptor, 1, 0) > 0 else { return false }
        return descriptor.revents & (pollReadHangUp | Int16(POLLHUP) | Int16(POLLERR)) != 0
    }

    /// Returns when no request is active (from its headers to its completion), or at `deadline`.
    func waitForNoActiveRequests(until deadline: ContinuousClock.Instant) {
        while activeRequests.load(ordering: .sequentiallyConsistent) > 0 {
            let left = deadline - .now
            guard left > .zero else { return }
            let nanoseconds = Int(clamping: left.components.seconds * 1_000_000_000 + left.components.attoseconds / 1_000_000_000)
            _ = drained.wait(timeout: .now() + .nanoseconds(nanoseconds))
        }
    }

    // MARK: - libmicrohttpd callbacks

    /// MHD_AccessHandlerCallback: called once when headers are in, once per body chunk, then with
    /// no data when the body is complete (and again after a resume).
    static func accessHandler(
        _ cls: UnsafeMutableRawPointer?, _ connection: OpaquePointer?, _ url: UnsafePointer<CChar>?,
        _ method: UnsafePointer<CChar>?, _ uploadData: UnsafePointer<CChar>?,
        _ uploadDataSize: UnsafeMutablePointer<Int>?, _ requestSlot: UnsafeMutablePointer<UnsafeMutableRawPointer?>?
    ) -> MHD_Result {
        guard let cls, let connection, let requestSlot, let uploadDataSize else { return .NO }
        let daemon = Unmanaged<DaemonContext>.fromOpaque(cls).takeUnretainedValue()

        guard let slot = requestSlot.pointee else {
            // First call: headers only.
            let request = RequestContext(connection: connection, daemon: daemon)
            requestSlot.pointee = Unmanaged.passRetained(request).toOpaque()
            daemon.activeRequests.add(1, ordering: .sequentiallyConsistent)
            if let admit = daemon.admit,
                let refusal = admit({ name in MHD_lookup_connection_value(connection, .HEADER_KIND, name).map { String(cString: $0) } })
            {
                request.phase.withLock { $0 = .sent }
                return queue(refusal, on: connection, daemon: daemon)
            }
            if let declared = MHD_lookup_connection_value(connection, .HEADER_KIND, "Content-Length") {
                // An unparsable length is libmicrohttpd's to reject; one too large is ours.
                if let length = UInt64(String(cString: declared)), length > UInt64(daemon.maxBodyBytes) {
                    daemon.logger.debug("http.request.body_too_large", metadata: ["http.content_length": "\(length)"])
                    request.phase.withLock { $0 = .sent }
                    return queue(.serverError(status: 413, "payload_too_large"), on: connection, daemon: daemon)
                }
                if let length = Int(String(cString: declared)) { request.body.reserveCapacity(length) }
            }
            return .YES
        }
        let request = Unmanaged<RequestContext>.fromOpaque(slot).takeUnretainedValue()

        if uploadDataSize.pointee > 0 {
            let count = uploadDataSize.pointee
            uploadDataSize.pointee = 0
            if request.bodyTooLarge || request.body.count + count > daemon.maxBodyBytes {
                // Streaming (chunked) past the cap: stop buffering, drop what we have, and read on
                // to the end so a 413 can be sent; a client that keeps going is cut off.
                if !request.bodyTooLarge {
                    request.bodyTooLarge = true
                    request.body = []
                    daemon.logger.debug("http.request.body_too_large")
                }
                request.discardedBytes += count
                return request.discardedBytes > 4 * daemon.maxBodyBytes + 65536 ? .NO : .YES
            }
            if let uploadData {
                uploadData.withMemoryRebound(to: UInt8.self, capacity: count) {
                    request.body.append(contentsOf: UnsafeBufferPointer(start: $0, count: count))
                }
            }
            return .YES
        }

        // The body is complete (or the connection was resumed).
        daemon.setWaiting(connection, since: nil)
        enum Next { case handle, queue(HTTPResponse), wait }
        let next = request.phase.withLock { phase -> Next in
            switch phase {
            case .receiving:
                phase = .handling
                return .handle
            case .responded(let response):
                phase = .sent
                return .queue(response)
            case .handling, .suspended, .sent, .finished:
                return .wait
            }
        }
        switch next {
        case .wait:
            return .YES
        case .queue(let response):
            return queue(response, on: connection, daemon: daemon)
        case .handle:
            break
        }

        if request.bodyTooLarge || daemon.rejectingRequests.load(ordering: .relaxed) {
            request.phase.withLock { $0 = .sent }
            let response: HTTPResponse = request.bodyTooLarge
                ? .serverError(status: 413, "payload_too_large") : .serverError(status: 503, "shutting_down")
            return queue(response, on: connection, daemon: daemon)
        }

        // The path and the query as decoded text, or 400: a `%00` (decoded to 0xFF by
        // CMicroHTTPD_unescape) or escapes that are not UTF-8 would otherwise reach the handler as
        // a shorter or repaired string, naming another resource than the client's.
        guard let path = url.map({ String(validatingCString: $0) }) ?? "/",
              let query = validatedValues(of: .GET_ARGUMENT_KIND, on: connection)
        else {
            request.phase.withLock { $0 = .sent }
            daemon.logger.debug("http.request.undecodable_target")
            return queue(.serverError(status: 400, "bad_request"), on: connection, daemon: daemon)
        }
        let httpRequest = HTTPRequest(
            method: method.map { String(cString: $0) } ?? "GET",
            path: path,
            query: query,
            headers: values(of: .HEADER_KIND, on: connection, lowercased: true),
            body: request.body,
            remoteAddress: remoteAddress(of: connection))
        request.body = []
        daemon.logger.debug("http.request", metadata: ["http.method": .string(httpRequest.method),
                                                       "http.path": .string(httpRequest.path)])
        let started = ContinuousClock.now
        let endWork = daemon.handler.start(httpRequest) { [request] response in request.complete(with: response) }

        // Answered synchronously: queue now, no suspension. Otherwise suspend until `respond`.
        let ready = request.phase.withLock { phase -> HTTPResponse? in
            if case .responded(let response) = phase {
                phase = .sent
                return response
            }
            phase = .suspended
            request.daemon.rememberSuspended(
                SuspendedRequest(request: request, since: started, socket: CMicroHTTPD_connection_fd(connection), endWork: endWork))
            MHD_suspend_connection(connection)
            return nil
        }
        if let ready { return queue(ready, on: connection, daemon: daemon) }
        return .YES
    }

    /// MHD_NotifyConnectionCallback: a connection opened or is about to be closed.
    static func connectionChanged(
        _ cls: UnsafeMutableRawPointer?, _ connection: OpaquePointer?, _ notification: MHD_ConnectionNotificationCode
    ) {
        guard let cls, let connection else { return }
        let daemon = Unmanaged<DaemonContext>.fromOpaque(cls).takeUnretainedValue()
        let key = UInt(bitPattern: Int(bitPattern: UnsafeRawPointer(connection)))
        if notification == .CONNECTION_NOTIFY_STARTED {
            daemon.connectionsAccepted.add(1, ordering: .relaxed)
            let socket = CMicroHTTPD_connection_fd(connection)
            guard socket >= 0 else { return }
            daemon.connections.withLock { $0[key] = (socket, ContinuousClock.now) }
        } else {
            _ = daemon.connections.withLock { $0.removeValue(forKey: key) }
        }
    }

    /// MHD_RequestCompletedCallback: the request is over (sent, failed, timed out or closed).
    static func requestCompleted(
        _ cls: UnsafeMutableRawPointer?, _ connection: OpaquePointer?,
        _ requestSlot: UnsafeMutablePointer<UnsafeMutableRawPointer?>?, _ termination: MHD_RequestTerminationCode
    ) {
        guard let cls else { return }
        let daemon = Unmanaged<DaemonContext>.fromOpaque(cls).takeUnretainedValue()
        // A kept-alive connection now waits for its next request: the deadline starts again.
        if let connection { daemon.setWaiting(connection, since: .now) }
        guard let requestSlot, let slot = requestSlot.pointee else { return }
        requestSlot.pointee = nil
        // Balances passRetained in the first access-handler call.
        let request = Unmanaged<RequestContext>.fromOpaque(slot).takeRetainedValue()
        let wasSuspended = request.phase.withLock { phase -> Bool in
            defer { phase = .finished }
            if case .suspended = phase { return true }
            return false
        }
        if wasSuspended { daemon.forgetSuspended(request) }
        let stillActive = daemon.activeRequests.subtract(1, ordering: .sequentiallyConsistent).newValue
        if stillActive == 0, daemon.closingConnections.load(ordering: .sequentiallyConsistent) { daemon.drained.signal() }
        // A request cut by libmicrohttpd's idle timeout (a client that went quiet mid-request) is a
        // timed-out connection as much as one the deadline reaper cut: counted the same way.
        if termination.rawValue == 2 /* MHD_REQUEST_TERMINATED_TIMEOUT_REACHED */ {
            daemon.onRefusal?(.requestTimeout, 1)
        }
        if termination.rawValue != 0 /* MHD_REQUEST_TERMINATED_COMPLETED_OK */ {
            daemon.logger.debug("http.request.aborted", metadata: ["http.termination": "\(termination.rawValue)"])
        }
    }

    /// MHD_OPTION_EXTERNAL_LOGGER, formatted by the shim.
    static func log(_ cls: UnsafeMutableRawPointer?, _ message: UnsafePointer<CChar>) {
        guard let cls else { return }
        let daemon = Unmanaged<DaemonContext>.fromOpaque(cls).takeUnretainedValue()
        var text = String(cString: message)
        while text.last?.isNewline == true { text.removeLast() }
        daemon.lastDaemonMessage.withLock { $0 = text }
        // Logged as the limits refuse a connection, on the accepting thread (one message for both):
        // below the server's limit, it was the address's.
        if let onRefusal = daemon.onRefusal, text.hasPrefix("Server reached connection limit") {
            let open = daemon.connections.withLock { $0.count }
            onRefusal(open >= daemon.connectionLimit ? .connectionLimit : .perAddressLimit, 1)
        }
        daemon.logger.debug("http.daemon.log", metadata: ["http.daemon.message": .string(text)])
    }

    // MARK: - Helpers

    private static func queue(_ response: HTTPResponse, on connection: OpaquePointer, daemon: DaemonContext)
        -> MHD_Result
    {
        let created = response.body.withUnsafeBytes { bytes in
            bytes.isEmpty
                ? MHD_create_response_from_buffer(0, nil, .RESPMEM_PERSISTENT)
                : MHD_create_response_from_buffer(
                    bytes.count, UnsafeMutableRawPointer(mutating: bytes.baseAddress), .RESPMEM_MUST_COPY)
        }
        guard let created else { return .NO }
        defer { MHD_destroy_response(created) }
        var hasContentType = false
        for (name, value) in response.headers {
            switch name.lowercased() {
            case "content-length", "transfer-encoding": continue  // libmicrohttpd's job
            case "content-type": hasContentType = true
            default: break
            }
            if MHD_add_response_header(created, name, value) != .YES {
                daemon.logger.debug("http.response.header_rejected", metadata: ["http.header": .string(name)])
            }
        }
        if !hasContentType { _ = MHD_add_response_header(created, "Content-Type", "application/octet-stream") }
        if daemon.closingConnections.load(ordering: .relaxed) {
            _ = MHD_add_response_header(created, "Connection", "close")
        }
        return MHD_queue_response(connection, UInt32(clamping: response.status), created)
    }

    /// The query's arguments, or nil when a name or value is not UTF-8 (a `%00` among them).
    private static func validatedValues(of kind: MHD_ValueKind, on connection: OpaquePointer) -> [String: String]? {
        var collected: (values: [String: String], valid: Bool) = ([:], true)
        withUnsafeMutablePointer(to: &collected) { pointer in
            _ = MHD_get_connection_values(connection, kind, { cls, _, key, value in
                guard let cls, let key else { return .YES }
                let target = cls.assumingMemoryBound(to: (values: [String: String], valid: Bool).self)
                guard let name = String(validatingCString: key), let text = value.map({ String(validatingCString: $0) }) ?? ""
                else {
                    target.pointee.valid = false
                    return .NO
                }
                target.pointee.values[name] = text
                return .YES
            }, pointer)
        }
        return collected.valid ? collected.values : nil
    }

    private static func values(of kind: MHD_ValueKind, on connection: OpaquePointer, lowercased: Bool)
        -> [String: String]
    {
        var collected: (values: [String: String], lowercased: Bool) = ([:], lowercased)
        // Sized once (a null iterator only counts): grown one insert at a time, the table was
        // reallocated and every name hashed again at each doubling, on every request.
        collected.values.reserveCapacity(max(0, Int(MHD_get_connection_values(connection, kind, nil, nil))))
        withUnsafeMutablePointer(to: &collected) { pointer in
            _ = MHD_get_connection_values(connection, kind, { cls, _, key, value in
                guard let cls, let key else { return .YES }
                let target = cls.assumingMemoryBound(to: (values: [String: String], lowercased: Bool).self)
                var name = String(cString: key)
                if target.pointee.lowercased { name = name.lowercased() }
                let text = value.map { String(cString: $0) } ?? ""
                if target.pointee.lowercased, let earlier = target.pointee.values[name] {
                    target.pointee.values[name] = earlier + ", " + text
                } else {
                    target.pointee.values[name] = text
                }
                return .YES
            }, pointer)
        }
        return collected.values
    }

    private static func remoteAddress(of connection: OpaquePointer) -> String? {
        withUnsafeTemporaryAllocation(of: CChar.self, capacity: 64) { buffer in
            guard let base = buffer.baseAddress,
                  CMicroHTTPD_client_address(connection, base, socklen_t(buffer.count)) != 0
            else { return nil }
            return String(cString: base)
        }
    }
}

/// Linux's POLLRDHUP (the peer closed its end), hidden from Swift behind `_GNU_SOURCE`.
private let pollReadHangUp: Int16 = 0x2000

/// A request whose connection is suspended until its handler answers.
struct SuspendedRequest: Sendable {
    let request: RequestContext
    /// When its handler started.
    let since: ContinuousClock.Instant
    /// Its connection's socket, polled for a client that has gone.
    let socket: Int32
    /// Ends its work (`HTTPHandler.start`); nil once called, or when it cannot be ended early.
    var endWork: (@Sendable () -> Void)?
}
