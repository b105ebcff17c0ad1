import Dispatch
#if canImport(Glibc)
    import Glibc
#endif

/// SIGTERM and SIGINT as an awaitable event, so `main` can stop accepting work and drain.
package enum Termination {
    /// Returns the name of the first SIGTERM or SIGINT received after this call.
    package static func wait() async -> String {
        await withCheckedContinuation { continuation in
            let queue = DispatchQueue(label: "siwa.signals")
            let once = OnceFlag()
            var sources: [any DispatchSourceSignal] = []
            for (number, name) in [(SIGTERM, "SIGTERM"), (SIGINT, "SIGINT")] {
                signal(number, SIG_IGN)  // the dispatch source sees it instead of the default handler
                let source = DispatchSource.makeSignalSource(signal: number, queue: queue)
                source.setEventHandler {
                    guard once.claim() else { return }
                    for source in sources { source.cancel() }
                    continuation.resume(returning: name)
                }
                sources.append(source)
            }
            queue.sync { for source in sources { source.resume() } }
        }
    }
}

/// True for the first caller only; touched only on one serial queue.
private final class OnceFlag: @unchecked Sendable {
    private var claimed = false
    func claim() -> Bool {
        defer { claimed = true }
        return !claimed
    }
}
