#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
internal import CMicroHTTPD
import Dispatch
package import Logging
import Locking
import Synchronization

/// An HTTP/1.1 server over libmicrohttpd: an epoll thread pool, keep-alive, and limits
/// (connections, per-IP connections, idle timeout, body size) enforced by the library.
///
/// How a request runs (README.md): libmicrohttpd's pool threads read it; the handler starts its
/// work (an `async` handler: a task on the standard executors) and the connection is suspended,
/// holding no thread, until the handler answers. A watcher thread ends the work of a request whose
/// deadline passed or whose client has gone; `stop()` ends the rest after the grace period.
/// `start()` returns once listening; `stop()` stops accepting, gives in-flight requests
/// `shutdownGracePeriod`, then ends their work and answers any still waiting with 503.
package final class HTTPServer: Sendable {
    package struct Configuration: Sendable {
        /// Numeric IPv4 ("127.0.0.1", "0.0.0.0"), bracketed or bare numeric IPv6 ("[::1]"), or "localhost".
        package var host: String
        /// 0 picks a free port; read it back from `HTTPServer.port`.
        package var port: Int
        /// Threads in libmicrohttpd's pool, each with its own epoll set.
        package var threadCount: Int
        /// Open connections at once; more are refused by libmicrohttpd.
        package var connectionLimit: Int
        /// Open connections at once from one address; `nil` for no limit.
        package var perIPConnectionLimit: Int?
        /// A connection idle this long (no bytes either way) is closed; whole seconds, rounded up.
        package var connectionTimeout: Duration
        /// A connection whose next request has not arrived whole (headers and body) this long after
        /// it opened or after its last answer is closed, however steadily it trickles bytes; nil
        /// for no deadline. Checked about four times per deadline (at least once a second).
        package var requestDeadline: Duration?
        /// A request whose handler has not answered this long after the request arrived has its
        /// work ended (`HTTPHandler.start`); nil for no bound but the handler's own. Checked as often.
        package var workDeadline: Duration?
        /// Larger bodies get 413 and never reach the handler.
        package var maxBodyBytes: Int
        /// How long `stop()` waits for in-flight requests before answering them 503.
        package var shutdownGracePeriod: Duration
        /// Answer over HTTPS (TLS 1.2 or later) with this certificate and key; nil for plain HTTP.
        package var tls: TLSIdentity?
        /// Told of every connection the server refused or cut off on its own, with how many (from
        /// libmicrohttpd's accepting thread or the deadline's): count it, log it; never block.
        package var onRefusal: (@Sendable (ConnectionRefusal, Int) -> Void)?
        /// Asked once a request's headers are in, before its body is read and before any other
        /// check (the target's decoding, the body's size): a response answers the request at once
        /// (the handler never sees it), nil lets it on. Reads headers through the lookup it is given.
        package var admit: (@Sendable (_ header: (String) -> String?) -> HTTPResponse?)?

        package init(
            host: String = "127.0.0.1", port: Int = 8080, threadCount: Int = Configuration.processorCount,
            connectionLimit: Int = 1024, perIPConnectionLimit: Int? = nil, connectionTimeout: Duration = .seconds(10),
            maxBodyBytes: Int = 65536, shutdownGracePeriod: Duration = .seconds(5), requestDeadline: Duration? = nil,
            workDeadline: Duration? = nil, tls: TLSIdentity? = nil
        ) {
            self.tls = tls
            self.workDeadline = workDeadline
            self.requestDeadline = requestDeadline
            self.host = host
            self.port = port
            self.threadCount = threadCount
            self.connectionLimit = connectionLimit
            self.perIPConnectionLimit = perIPConnectionLimit
            self.connectionTimeout = connectionTimeout
            self.maxBodyBytes = maxBodyBytes
            self.shutdownGracePeriod = shutdownGracePeriod
        }

        /// Processors online, at least 1.
        package static var processorCount: Int { max(1, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN)))) }
    }

    /// A running daemon and what must outlive it.
    /// `@unchecked Sendable`: the pointers are only used under `state`'s lock, by start and stop.
    private struct Running: @unchecked Sendable {
        var daemon: OpaquePointer
        var listenSocket: Int32
        var context: Unmanaged<DaemonContext>
        var logTarget: UnsafeMutablePointer<CMicroHTTPD_LogTarget>
        var port: Int
        var reaper: DeadlineReaper
        /// The TLS key and certificate as C strings, freed after the daemon stops (nil for HTTP).
        var tlsStrings: [UnsafeMutablePointer<CChar>]
    }

    package let configuration: Configuration
    private let handler: any HTTPHandler
    private let logger: Logger
    private let state = Locked<Running?>(nil)

    package init(configuration: Configuration, handler: any HTTPHandler, logger: Logger = Logger(label: "http-server")) {
        self.configuration = configuration
        self.handler = handler
        self.logger = logger
    }

    /// A server whose handler answers synchronously (it must not block).
    package convenience init(
        configuration: Configuration, logger: Logger = Logger(label: "http-server"), respond: @escaping @Sendable (HTTPRequest) -> HTTPResponse
    ) {
        self.init(configuration: configuration, handler: ClosureHTTPHandler(synchronous: respond), logger: logger)
    }

    /// A server whose handler is `async`, run in a task per request on the standard executors; the
    /// task is cancelled when the request's work must end early (see `HTTPHandler.start`).
    package convenience init(
        configuration: Configuration, logger: Logger = Logger(label: "http-server"),
        asyncRespond: @escaping @Sendable (HTTPRequest) async -> HTTPResponse
    ) {
        self.init(configuration: configuration, handler: AsyncHTTPHandler(asyncRespond), logger: logger)
    }

    deinit { stop() }

    /// The bound port (the real one when configured with 0); 0 when not running.
    package var port: Int { state.withLock { $0?.port ?? 0 } }

    /// Connections accepted since `start()` (TLS handshakes, over HTTPS); 0 when not running.
    package var connectionsAccepted: Int {
        state.withLock { $0?.context.takeUnretainedValue().connectionsAccepted.load(ordering: .relaxed) ?? 0 }
    }

    /// Binds, starts the thread pool, and returns once connections are accepted.
    package func start() throws {
        try state.withLock { running throws(HTTPServerError) in
            let configuration = configuration
            let address = "\(configuration.host):\(configuration.port)"
            guard running == nil else {
                throw HTTPServerError(code: .alreadyRunning, operation: "start", address: address,
                                      message: "the server is already running")
            }
            if configuration.tls != nil, CMicroHTTPD_supports_tls() == 0 {
                throw HTTPServerError(code: .tlsUnavailable, operation: "start", address: address,
                                      message: "this libmicrohttpd was built without TLS support")
            }
            let listenSocket = try ListeningSocket.open(host: configuration.host, port: configuration.port)
            // strdup'd: libmicrohttpd reads them at start; kept until MHD_stop_daemon to be safe.
            let tlsStrings = configuration.tls.map {
                [strdup($0.privateKeyPEM)!, strdup($0.certificateChainPEM)!, strdup(TLSIdentity.priorities)!]
            } ?? []
            let context = Unmanaged.passRetained(
                DaemonContext(
                handler: handler, logger: logger, maxBodyBytes: configuration.maxBodyBytes,
                connectionLimit: configuration.connectionLimit, onRefusal: configuration.onRefusal, admit: configuration.admit))
            let logTarget = UnsafeMutablePointer<CMicroHTTPD_LogTarget>.allocate(capacity: 1)
            logTarget.initialize(to: CMicroHTTPD_LogTarget(
                function: { cls, message in DaemonContext.log(cls, message) }, context: context.toOpaque()))

            let timeout = configuration.connectionTimeout.components
            let timeoutSeconds = max(1, timeout.seconds + (timeout.attoseconds > 0 ? 1 : 0))
            let daemon = CMicroHTTPD_start(
                listenSocket, 0,
                UInt32(clamping: max(1, configuration.threadCount)),
                UInt32(clamping: max(1, configuration.connectionLimit)),
                UInt32(clamping: max(0, configuration.perIPConnectionLimit ?? 0)),
                UInt32(clamping: timeoutSeconds),
                { cls, connection, url, method, _, uploadData, uploadDataSize, requestSlot in
                    DaemonContext.accessHandler(cls, connection, url, method, uploadData, uploadDataSize, requestSlot)
                },
                context.toOpaque(),
                { cls, connection, requestSlot, termination in
                    DaemonContext.requestCompleted(cls, connection, requestSlot, termination)
                },
                context.toOpaque(),
                { cls, connection, _, notification in
                    DaemonContext.connectionChanged(cls, connection, notification)
                },
                context.toOpaque(),
                logTarget,
                tlsStrings.isEmpty ? nil : tlsStrings[0], tlsStrings.isEmpty ? nil : tlsStrings[1],
                tlsStrings.isEmpty ? nil : tlsStrings[2])
            guard let daemon else {
                let detail = context.takeUnretainedValue().lastDaemonMessage.withLock { $0 }
                Self.wipeAndFree(tlsStrings)
                close(listenSocket)
                context.release()
                logTarget.deinitialize(count: 1)
                logTarget.deallocate()
                throw HTTPServerError(code: .daemonStartFailed, operation: "MHD_start_daemon", address: address,
                                      message: detail ?? "libmicrohttpd did not start")
            }
            var port = Int(CMicroHTTPD_bound_port(daemon))
            if port == 0 { port = ListeningSocket.localPort(of: listenSocket) }
            let reaper = DeadlineReaper(
                context: context.takeUnretainedValue(), requestDeadline: configuration.requestDeadline,
                workDeadline: configuration.workDeadline, logger: logger, onRefusal: configuration.onRefusal)
            running = Running(daemon: daemon, listenSocket: listenSocket, context: context, logTarget: logTarget,
                              port: port, reaper: reaper, tlsStrings: tlsStrings)
            logger.info("http.server.started", metadata: ["http.host": .string(configuration.host),
                                                          "http.port": .int(port),
                                                          "http.scheme": .string(configuration.tls == nil ? "http" : "https"),
                                                          "http.threads": .int(configuration.threadCount)])
        }
    }

    /// Stops accepting, waits up to `shutdownGracePeriod` for in-flight requests (asking
    /// keep-alive clients to close), then ends the work of those still running (`HTTPHandler.start`)
    /// and answers them 503, and stops the daemon. Blocks for up to the grace period (plus a short
    /// flush): from async code prefer `run()`'s cancellation or call it off the cooperative pool.
    /// Returns at once when not running.
    package func stop() {
        // Taken out at once: `port` and a second `stop()` do not wait behind the grace period.
        // From then on every answer asks its client to close.
        guard let current = state.withLock({ running -> Running? in
            defer { running = nil }
            running?.context.takeUnretainedValue().closingConnections.store(true, ordering: .sequentiallyConsistent)
            return running
        }) else { return }
        let context = current.context.takeUnretainedValue()
        current.reaper.stop()
        // After quiescing the listen socket is ours to close, but only after MHD_stop_daemon.
        let quiesced = MHD_quiesce_daemon(current.daemon)

        let clock = ContinuousClock()
        context.waitForNoActiveRequests(until: clock.now.advanced(by: configuration.shutdownGracePeriod))
        context.rejectingRequests.store(true, ordering: .relaxed)
        let ended = context.endSuspendedWork(.shutdown)
        let answered = context.answerSuspended(with: .serverError(status: 503, "shutting_down"))
        if answered > 0 || ended > 0 {
            logger.warning("http.server.shutdown_answered_waiting", metadata: ["http.requests": .int(answered)])
            // Let the resumed connections send their 503 before the daemon closes them.
            context.waitForNoActiveRequests(until: clock.now.advanced(by: .milliseconds(250)))
        }
        MHD_stop_daemon(current.daemon)
        if quiesced >= 0 { close(quiesced) }
        // The callbacks can no longer run: release what they used.
        current.context.release()
        current.logTarget.deinitialize(count: 1)
        current.logTarget.deallocate()
        Self.wipeAndFree(current.tlsStrings)
        logger.info("http.server.stopped", metadata: ["http.port": .int(current.port)])
    }

    /// The private key is among them: zeroed, not left in freed memory.
    private static func wipeAndFree(_ strings: [UnsafeMutablePointer<CChar>]) {
        for string in strings {
            memset(string, 0, strlen(string))
            free(string)
        }
    }

    /// Starts, runs until the task is cancelled, then stops (for a service task group). The
    /// blocking `stop()` runs on a Dispatch thread, off the cooperative pool. `whileServing` runs
    /// once the server has started (its port is known), as a child task cancelled before the
    /// server stops: a server's own background work (the app API's key refresh and pruning).
    package func run(whileServing: @escaping @Sendable () async -> Void = {}) async throws {
        try start()
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await whileServing() }
            while !Task.isCancelled {
                try? await Task.sleep(for: .seconds(3600))
            }
            group.cancelAll()
        }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            DispatchQueue.global().async {
                self.stop()
                continuation.resume()
            }
        }
    }
}

/// Why the server refused or closed a connection on its own.
package enum ConnectionRefusal: String, Sendable, CaseIterable {
    /// The address already held `perIPConnectionLimit` connections: closed as it was accepted.
    case perAddressLimit = "per_address_limit"
    /// The server already held `connectionLimit` connections: closed as it was accepted.
    case connectionLimit = "connection_limit"
    /// A request had not arrived whole within `requestDeadline`: its connection was shut down.
    case requestTimeout = "request_timeout"
}

/// The server's watcher thread, while the daemon runs: closes connections whose request has not
/// arrived whole within `Configuration.requestDeadline`, and ends the work of requests in flight
/// longer than `workDeadline` or whose client has gone (libmicrohttpd does not watch a suspended
/// connection).
private final class DeadlineReaper: Sendable {
    private let stopped = Atomic<Bool>(false)
    /// Signalled by `stop()`: the pass interval is a quarter of the shorter deadline (at most a
    /// second), and shutting down must not wait for it.
    private let wake = DispatchSemaphore(value: 0)
    private let done = DispatchSemaphore(value: 0)

    init(
        context: DaemonContext, requestDeadline: Duration?, workDeadline: Duration?, logger: Logger,
        onRefusal: (@Sendable (ConnectionRefusal, Int) -> Void)?
    ) {
        let shorter = [requestDeadline, workDeadline].compactMap { $0 }.min() ?? .seconds(4)
        let tick = min(.seconds(1), max(Duration.milliseconds(50), shorter / 4))
        let tickNanoseconds = Int(clamping: tick.components.seconds * 1_000_000_000 + tick.components.attoseconds / 1_000_000_000)
        // A queue of its own: its one block waits between passes for as long as the daemon runs.
        DispatchQueue(label: "http-request-deadline").async { [self] in
            while !stopped.load(ordering: .acquiring) {
                _ = wake.wait(timeout: .now() + .nanoseconds(tickNanoseconds))
                if stopped.load(ordering: .acquiring) { break }
                if let requestDeadline {
                    let cut = context.shutDownConnections(waitingLongerThan: requestDeadline)
                    if cut > 0 {
                        logger.info("http.request.deadline", metadata: ["http.connections_closed": .int(cut)])
                        onRefusal?(.requestTimeout, cut)
                    }
                }
                let ended = context.endSuspendedWork(.deadlineOrClientGone(workDeadline))
                if ended > 0 { logger.info("http.request.work_ended", metadata: ["http.requests": .int(ended)]) }
            }
            done.signal()
        }
    }

    /// Returns once the thread has finished its last pass (it never touches a socket after).
    func stop() {
        stopped.store(true, ordering: .releasing)
        wake.signal()
        done.wait()
    }
}
