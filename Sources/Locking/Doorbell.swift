internal import Dispatch

/// A wake-up signal with a bounded wait, for any number of waiters: `ring()` wakes the longest
/// waiting one, or, when none waits, makes the next `wait` return at once; `ringAll()` wakes every
/// waiter. Used for NOTIFY → claim, job finished → claim more, and shutdown.
package final class Doorbell: Sendable {
    /// Why a `wait` returned.
    package enum Wake: Sendable, Equatable {
        case rung
        case timedOut
    }

    private struct State {
        var rung = false
        var waiters: [(id: UInt64, continuation: CheckedContinuation<Wake, Never>)] = []
        var nextID: UInt64 = 0
    }

    private let state = Locked(State())

    package init() {}

    package func ring() {
        let continuation = state.withLock { state -> CheckedContinuation<Wake, Never>? in
            guard !state.waiters.isEmpty else {
                state.rung = true
                return nil
            }
            return state.waiters.removeFirst().continuation
        }
        continuation?.resume(returning: .rung)
    }

    /// Wakes every waiter (shutdown); the next `wait` also returns at once.
    package func ringAll() {
        let continuations = state.withLock { state -> [CheckedContinuation<Wake, Never>] in
            state.rung = true
            defer { state.waiters.removeAll() }
            return state.waiters.map(\.continuation)
        }
        for continuation in continuations { continuation.resume(returning: .rung) }
    }

    /// Returns when rung (also if rung before this call) or after `timeout`, saying which.
    @discardableResult
    package func wait(timeout: Duration) async -> Wake {
        await withCheckedContinuation { (continuation: CheckedContinuation<Wake, Never>) in
            let id = state.withLock { state -> UInt64? in
                if state.rung {
                    state.rung = false
                    return nil
                }
                state.nextID &+= 1
                state.waiters.append((state.nextID, continuation))
                return state.nextID
            }
            guard let id else {
                continuation.resume(returning: .rung)
                return
            }
            let nanoseconds = max(0, Int(timeout.components.seconds) * 1_000_000_000
                + Int(timeout.components.attoseconds / 1_000_000_000))
            DispatchQueue.global().asyncAfter(deadline: .now() + .nanoseconds(nanoseconds)) { [self] in
                let expired = state.withLock { state -> CheckedContinuation<Wake, Never>? in
                    guard let index = state.waiters.firstIndex(where: { $0.id == id }) else { return nil }
                    return state.waiters.remove(at: index).continuation
                }
                expired?.resume(returning: .timedOut)
            }
        }
    }
}
