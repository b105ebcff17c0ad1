internal import Dispatch
internal import Foundation
import Locking
import LoopbackHTTP

/// POSTs to an `http://` endpoint on a loopback address (the only plain-HTTP endpoints
/// `SIWA_WEBHOOK_URL` accepts: a receiver on the same host) over keep-alive HTTP/1.1 connections of
/// our own (`LoopbackHTTPClient`), each exchange a few blocking calls on a thread of its own (see
/// `send`), at most `threadLimit` at once.
///
/// Why not URLSession here: on Linux each of its requests goes through curl handles, dispatch
/// sources, timers and several thread hops. Measured by `deploy/bench/webhooks.sh`, that was about
/// 300 µs of worker CPU per delivery, two thirds of what a delivery cost the whole machine (sink
/// and PostgreSQL included). `https://` endpoints still go through URLSession (TLS and certificate
/// checks are its job, not ours).
///
/// Every exchange is bounded by the timeout; a redirect is an answer like any other (never
/// followed); the answer's first 512 bytes of body are kept.
final class LoopbackHTTPTransport: Sendable {
    /// The most of an answer's body a delivery records.
    static let keptBodyBytes = 512

    private let client: LoopbackHTTPClient
    private let timeout: Duration

    /// Exchanges blocking a thread at once, at most. libdispatch's overcommit pool stops at 255
    /// threads for the whole process, and the database connections' calls run there too: without a
    /// cap, `SIWA_WEBHOOK_CONCURRENCY` near that against a hanging endpoint would stall them all.
    /// Deliveries beyond it wait (without a thread) for a slot; their timeout starts when they go.
    static let defaultThreadLimit = 128
    private let threads: ThreadSlots

    /// nil unless `url` is `http://` to a numeric loopback address or `localhost`.
    init?(url: URL, timeout: Duration, threadLimit: Int = LoopbackHTTPTransport.defaultThreadLimit) {
        guard let client = LoopbackHTTPClient(url: url, keptBodyBytes: Self.keptBodyBytes) else { return nil }
        self.client = client
        self.timeout = timeout
        threads = ThreadSlots(threadLimit)
    }

    func send(body: [UInt8], headers: [(String, String)]) async -> WebhookAttemptResult {
        let headers = [("User-Agent", "siwa-notifications-webhooks")] + headers
        await threads.acquire()
        defer { threads.release() }
        let deadline = ContinuousClock.now + timeout
        // A serial queue of its own per exchange: it runs on libdispatch's overcommit pool, which
        // adds a thread whenever the others are busy, so exchanges blocked on slow endpoints never
        // hold back the rest. (A concurrent queue, or the global one, runs on the pool sized to the
        // CPUs: two slow endpoints would stall every delivery, and every timer of the process.)
        // Never on the Swift concurrency pool either, for the same reason.
        return await withCheckedContinuation { continuation in
            DispatchQueue(label: "siwa.webhooks.http").async {
                continuation.resume(returning: self.exchange(body, headers: headers, deadline: deadline))
            }
        }
    }

    /// One delivery, blocking. An answer whose body was cut short still answered: its status is
    /// what the delivery records.
    private func exchange(_ body: [UInt8], headers: [(String, String)], deadline: ContinuousClock.Instant) -> WebhookAttemptResult {
        do throws(LoopbackHTTPFailure) {
            let answer = try client.post(body, headers: headers, deadline: deadline)
            return .answered(status: answer.status, bodyPrefix: String(decoding: answer.body, as: UTF8.self))
        } catch .timedOut {
            return .timedOut
        } catch {
            return .connectionFailed(detail: "\(error)")
        }
    }
}

/// A counting semaphore whose waiters suspend (they hold no thread while they wait).
final class ThreadSlots: Sendable {
    private let state: Locked<(free: Int, waiting: [CheckedContinuation<Void, Never>])>

    init(_ count: Int) { state = Locked((max(1, count), [])) }

    func acquire() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let granted = state.withLock { state -> Bool in
                guard state.free > 0 else {
                    state.waiting.append(continuation)
                    return false
                }
                state.free -= 1
                return true
            }
            if granted { continuation.resume() }
        }
    }

    /// Hands the slot to the longest waiter, if any.
    func release() {
        let next = state.withLock { state -> CheckedContinuation<Void, Never>? in
            guard !state.waiting.isEmpty else {
                state.free += 1
                return nil
            }
            return state.waiting.removeFirst()
        }
        next?.resume()
    }

}
