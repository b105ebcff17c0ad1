internal import CMicroHTTPD
import Locking

/// Per-request state, stored in libmicrohttpd's `con_cls` slot (retained there from the first
/// access-handler call until the request-completed notification releases it).
///
/// `@unchecked Sendable`: `body`, `bodyTooLarge` and `discardedBytes` are touched only from the
/// access handler, which libmicrohttpd runs for one connection on one thread at a time (its
/// suspend/resume hand-off orders the calls); everything shared with `respond` is in `phase`.
final class RequestContext: @unchecked Sendable {
    enum Phase {
        /// Headers and body arriving.
        case receiving
        /// The handler is running inside the access-handler call.
        case handling
        /// The handler returned without responding; the connection is suspended.
        case suspended
        /// `respond` was called; the response waits for the next access-handler call.
        case responded(HTTPResponse)
        /// A response was queued with libmicrohttpd.
        case sent
        /// libmicrohttpd reported the request complete; the connection must not be touched.
        case finished
    }

    let connection: OpaquePointer
    let daemon: DaemonContext
    var body: [UInt8] = []
    var bodyTooLarge = false
    var discardedBytes = 0
    let phase = Locked<Phase>(.receiving)

    init(connection: OpaquePointer, daemon: DaemonContext) {
        self.connection = connection
        self.daemon = daemon
    }

    /// The handler's completion: any thread, any time, first call wins.
    func complete(with response: HTTPResponse) {
        let resumed = phase.withLock { phase -> Bool in
            switch phase {
            case .handling:
                phase = .responded(response)
                return false
            case .suspended:
                phase = .responded(response)
                // Under the lock, so the request-completed callback cannot free the connection
                // in between. (It is only ever suspended while in this state.)
                MHD_resume_connection(connection)
                return true
            case .receiving, .responded, .sent, .finished:
                return false
            }
        }
        if resumed { daemon.forgetSuspended(self) }
    }
}
