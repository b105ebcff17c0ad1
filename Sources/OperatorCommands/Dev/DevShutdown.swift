import Lifecycle

#if canImport(Glibc)
    import Glibc
#endif

/// What ends a `siwa dev` run from outside: SIGINT (Ctrl-C), SIGTERM, SIGHUP (the terminal closed)
/// or the pipe its output goes to closing (`siwa dev | head -1`). Each leads to the same orderly
/// stop; SIGKILL, which no process can catch, is the orphan reaper's (LocalPostgres).
enum DevShutdown {
    /// The name of the first of them to happen; nil if cancelled first.
    static func wait(output: DevOutput) async -> String? {
        // A closed pipe must be an EPIPE error on write, seen here, not a silent death that skips
        // the cleanup.
        signal(SIGPIPE, SIG_IGN)
        return await withTaskGroup(of: String?.self) { group in
            group.addTask { await Termination.signal(including: [(SIGHUP, "SIGHUP")]) }
            group.addTask { await outputClosed(output) }
            let first = await group.next() ?? nil
            group.cancelAll()
            return first
        }
    }

    /// Returns once a write failed with EPIPE, or the pipe on stdout has no reader left (poll's
    /// POLLERR on a pipe's write end); nil when cancelled.
    private static func outputClosed(_ output: DevOutput) async -> String? {
        while !Task.isCancelled {
            if output.isClosed || readerGone() { return "output closed" }
            try? await Task.sleep(for: .milliseconds(100))
        }
        return nil
    }

    private static func readerGone() -> Bool {
        var descriptor = pollfd(fd: 1, events: 0, revents: 0)
        return poll(&descriptor, 1, 0) > 0 && descriptor.revents & Int16(POLLERR) != 0
    }
}
