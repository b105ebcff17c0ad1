internal import Foundation
import CCurl
import Locking

/// One curl multi handle driven by one thread of its own: the shape curl's docs give for a
/// server. Calls are queued under a lock and the thread is woken (`curl_multi_wakeup`); it adds
/// their easy handles, lets curl run every transfer (`curl_multi_perform`, then `curl_multi_poll`
/// until a socket or a timeout needs it) and resumes each caller when its transfer is done. The
/// multi's connection cache keeps connections alive and reuses them across calls (HTTP/2 streams
/// share one connection); no caller's thread ever blocks on the network.
final class CurlPool: @unchecked Sendable {
    // @unchecked: `multi` and `active` are touched only by the pool's thread once it started;
    // everything the callers share with it is behind `queue`.
    private struct Queue {
        var added: [CurlTransfer] = []
        var cancelled: [CurlTransfer] = []
        /// Easy handles of finished transfers, reset, for the next calls (curl's advice: reuse them).
        var spare: [UnsafeMutableRawPointer] = []
    }

    let trust: CurlTrust
    private let multi: UnsafeMutableRawPointer
    private let queue = Locked(Queue())
    private var active: [UnsafeMutableRawPointer: CurlTransfer] = [:]
    private static let spareLimit = 64
    /// The connections the cache keeps, idle or not. curl's default is 4 × the transfers in the
    /// multi when a connection comes back: after a burst of calls, every call made while few are
    /// in flight closed an idle connection, and the next burst opened them again (over TLS a full
    /// handshake each, CPU at both ends). A connection is opened only when none to that host is
    /// idle, so the cache holds no more than the busiest moment needed; an idle one still goes
    /// after curl's CURLOPT_MAXAGE_CONN (118 s without use), or when the other end closes it.
    static let keptConnections = 1024

    init(trust: CurlTrust) {
        _ = Self.globalInit
        self.trust = trust
        guard let multi = curl_multi_init() else { fatalError("curl_multi_init failed (out of memory)") }
        self.multi = multi
        _ = CCurl_multi_setopt_long(multi, CURLMOPT_PIPELINING, Int(CURLPIPE_MULTIPLEX))
        _ = CCurl_multi_setopt_long(multi, CURLMOPT_MAXCONNECTS, Self.keptConnections)
        let thread = Thread { [self] in run() }
        thread.name = "siwa-http"
        thread.start()
    }

    /// curl_global_init, once, before the first handle (thread-safe in this libcurl, but once is enough).
    private static let globalInit: Void = { _ = curl_global_init(Int(CURL_GLOBAL_DEFAULT)) }()

    /// A handle for a new call: a spare one, else a new one.
    func makeHandle() -> UnsafeMutableRawPointer? {
        queue.withLock { $0.spare.popLast() } ?? curl_easy_init()
    }

    /// Hands a configured transfer to the pool's thread.
    func start(_ transfer: CurlTransfer) {
        queue.withLock { $0.added.append(transfer) }
        curl_multi_wakeup(multi)
    }

    /// Ends `transfer` with `.cancelled` if it is still running (else does nothing).
    func cancel(_ transfer: CurlTransfer) {
        queue.withLock { $0.cancelled.append(transfer) }
        curl_multi_wakeup(multi)
    }

    /// A handle whose transfer never reached the multi (its options were refused).
    func giveBack(_ handle: UnsafeMutableRawPointer) {
        curl_easy_reset(handle)
        let kept = queue.withLock { queue -> Bool in
            guard queue.spare.count < Self.spareLimit else { return false }
            queue.spare.append(handle)
            return true
        }
        if !kept { curl_easy_cleanup(handle) }
    }

    private func run() {
        var running: Int32 = 0
        while true {
            let (added, cancelled) = queue.withLock { queue in
                defer {
                    queue.added.removeAll(keepingCapacity: true)
                    queue.cancelled.removeAll(keepingCapacity: true)
                }
                return (queue.added, queue.cancelled)
            }
            for transfer in added {
                if curl_multi_add_handle(multi, transfer.handle) == CURLM_OK {
                    active[transfer.handle] = transfer
                } else {
                    transfer.finish(HTTPFailure(kind: .other, detail: "curl_multi_add_handle failed"))
                    giveBack(transfer.handle)
                }
            }
            for transfer in cancelled where active[transfer.handle] === transfer {
                active[transfer.handle] = nil
                curl_multi_remove_handle(multi, transfer.handle)
                transfer.finish(HTTPFailure(kind: .cancelled, detail: "the calling task was cancelled"))
                giveBack(transfer.handle)
            }
            curl_multi_perform(multi, &running)
            var left: Int32 = 0
            while let message = curl_multi_info_read(multi, &left) {
                guard message.pointee.msg == CURLMSG_DONE, let handle = message.pointee.easy_handle else { continue }
                let code = CCurl_message_result(message)
                curl_multi_remove_handle(multi, handle)
                let transfer = active.removeValue(forKey: handle)
                transfer?.finish(code)
                // The transfer owns the header list and body the handle points at: kept until reset.
                withExtendedLifetime(transfer) { giveBack(handle) }
            }
            // Sleeps until a socket is ready, curl's next timeout, a wake-up, or a second at most.
            curl_multi_poll(multi, nil, 0, 1000, nil)
        }
    }
}
