internal import Dispatch
import Locking

/// A wake-up signal with a bounded wait: `ring()` wakes the one waiter, or makes its next `wait`
/// return at once. Used for NOTIFY → claim, job finished → claim more, and shutdown.
final class Doorbell: Sendable {
    private struct State {
        var rung = false
        var waiter: (id: UInt64, continuation: CheckedContinuation<Void, Never>)?
        var nextID: UInt64 = 0
    }

    private let state = Locked(State())

    func ring() {
        let continuation = state.withLock { state -> CheckedContinuation<Void, Never>? in
            if let waiter = state.waiter {
                state.waiter = nil
                return waiter.continuation
            }
            state.rung = true
            return nil
        }
        continuation?.resume()
    }

    /// Returns when rung (also if rung before this call) or after `timeout`.
    func wait(timeout: Duration) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let id = state.withLock { state -> UInt64? in
                if state.rung {
                    state.rung = false
                    return nil
                }
                state.nextID &+= 1
                state.waiter = (state.nextID, continuation)
                return state.nextID
            }
            guard let id else {
                continuation.resume()
                return
            }
            let nanoseconds = max(0, Int(timeout.components.seconds) * 1_000_000_000
                + Int(timeout.components.attoseconds / 1_000_000_000))
            DispatchQueue.global().asyncAfter(deadline: .now() + .nanoseconds(nanoseconds)) { [self] in
                let expired = state.withLock { state -> CheckedContinuation<Void, Never>? in
                    guard let waiter = state.waiter, waiter.id == id else { return nil }
                    state.waiter = nil
                    return waiter.continuation
                }
                expired?.resume()
            }
        }
    }
}
