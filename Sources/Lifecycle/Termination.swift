import Dispatch
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// SIGTERM and SIGINT as an awaitable event. Signals belong to the executables' `main`: libraries
/// expose `run()` and stop when cancelled or asked to.
package enum Termination {
    /// Returns the name of the first SIGTERM or SIGINT received after this call, or "cancelled"
    /// when the waiting task is cancelled first.
    package static func wait() async -> String {
        await signal() ?? "cancelled"
    }

    /// The name of the first SIGTERM or SIGINT (or one of `extra`) received after this call; nil when
    /// the waiting task is cancelled first (so a task group racing it against a service can always finish).
    package static func signal(including extra: [(Int32, String)] = []) async -> String? {
        let wait = SignalWait(signals: [(SIGTERM, "SIGTERM"), (SIGINT, "SIGINT")] + extra)
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in wait.start(continuation) }
        } onCancel: {
            wait.finish(nil)
        }
    }

    /// Returns once the current task is cancelled.
    package static func untilCancelled() async {
        while !Task.isCancelled { try? await Task.sleep(for: .seconds(86_400)) }
    }
}

/// One wait for a signal: resumed once, by the first signal or by cancellation, whichever comes
/// first (cancellation may even come before `start`).
// @unchecked: `state` is behind its Mutex; `sources` is touched only on `queue`.
private final class SignalWait: @unchecked Sendable {
    private struct State {
        var continuation: CheckedContinuation<String?, Never>?
        var finished: String??  // .some(nil): cancelled
    }

    private let state = Mutex(State())
    private let queue = DispatchQueue(label: "siwa.signals")
    private var sources: [any DispatchSourceSignal] = []
    private let signals: [(Int32, String)]

    init(signals: [(Int32, String)]) { self.signals = signals }

    func start(_ continuation: CheckedContinuation<String?, Never>) {
        let finishedEarly = state.withLock { state -> String?? in
            if let finished = state.finished { return finished }
            state.continuation = continuation
            return nil
        }
        if let finishedEarly {
            continuation.resume(returning: finishedEarly)
            return
        }
        queue.sync {
            guard state.withLock({ $0.finished == nil }) else { return }
            for (number, name) in signals {
                signal(number, SIG_IGN)  // the dispatch source sees it instead of the default handler
                let source = DispatchSource.makeSignalSource(signal: number, queue: queue)
                source.setEventHandler { [self] in finish(name) }
                sources.append(source)
                source.resume()
            }
        }
    }

    func finish(_ name: String?) {
        let continuation = state.withLock { state -> CheckedContinuation<String?, Never>? in
            guard state.finished == nil else { return nil }
            state.finished = .some(name)
            defer { state.continuation = nil }
            return state.continuation
        }
        queue.async { [self] in
            for source in sources { source.cancel() }
            sources = []
        }
        continuation?.resume(returning: name)
    }
}
