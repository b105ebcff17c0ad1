import Locking

/// One call at a time on a session. libpq holds one statement in flight per connection, and a
/// statement sent from its task (`awaitReply`) leaves the connection's queue free while its reply
/// is on the way, so the queue alone no longer keeps callers apart: a connection shared by
/// concurrent tasks (the team transfer's export stores each identifier as it arrives) has them take
/// turns here. A call that finds the session busy waits for its turn without holding a thread;
/// turns go in the order asked.
final class SessionTurns: Sendable {
    private struct State {
        var busy = false
        var waiting: [UnsafeContinuation<Void, Never>] = []
    }

    private let state = Locked(State())

    /// Returns once the session is this caller's; `pass()` must follow.
    func take() async {
        if state.withLock({ state in
            if state.busy { return false }
            state.busy = true
            return true
        }) {
            return
        }
        // Unsafe, not checked: resumed exactly once, here or by `pass`, which resumes under the
        // lock this passes through afterwards (the order ThreadSanitizer needs, as `ReplyWatcher`).
        defer { state.withLock { _ in } }
        await withUnsafeContinuation { continuation in
            let now = state.withLock { state -> Bool in
                if !state.busy {
                    state.busy = true
                    return true
                }
                state.waiting.append(continuation)
                return false
            }
            if now { continuation.resume() }
        }
    }

    /// Hands the session to the next caller waiting, if any.
    func pass() {
        state.withLock { state in
            guard !state.waiting.isEmpty else {
                state.busy = false
                return
            }
            state.waiting.removeFirst().resume()  // still busy: handed over
        }
    }
}
