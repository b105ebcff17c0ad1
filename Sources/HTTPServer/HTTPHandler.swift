/// Answers requests. `respond` must be called exactly once, from any thread, now or later (for
/// example after a database commit). Until it is called the connection is suspended: it holds no
/// server thread. Calls after the first are ignored.
package protocol HTTPHandler: Sendable {
    func handle(_ request: HTTPRequest, respond: @escaping @Sendable (HTTPResponse) -> Void)

    /// `handle`, returning how to end the request's work early: the server calls it at most once,
    /// when the request's deadline passes, its client has gone, or `stop()`'s grace period is over.
    /// The work should then end at its next bound and answer (the answer may go nowhere). Nil: it
    /// cannot be ended early (the default, for a handler that answers at once).
    func start(_ request: HTTPRequest, respond: @escaping @Sendable (HTTPResponse) -> Void) -> (@Sendable () -> Void)?
}

extension HTTPHandler {
    package func start(_ request: HTTPRequest, respond: @escaping @Sendable (HTTPResponse) -> Void) -> (@Sendable () -> Void)? {
        handle(request, respond: respond)
        return nil
    }
}

/// A handler made from a closure, either with a completion (`init(_:)`) or returning the response
/// directly (`init(synchronous:)`, which must not block: it runs on a server thread).
package struct ClosureHTTPHandler: HTTPHandler {
    private let body: @Sendable (HTTPRequest, @escaping @Sendable (HTTPResponse) -> Void) -> Void

    package init(_ body: @escaping @Sendable (HTTPRequest, @escaping @Sendable (HTTPResponse) -> Void) -> Void) {
        self.body = body
    }

    package init(synchronous body: @escaping @Sendable (HTTPRequest) -> HTTPResponse) {
        self.body = { request, respond in respond(body(request)) }
    }

    package func handle(_ request: HTTPRequest, respond: @escaping @Sendable (HTTPResponse) -> Void) {
        body(request, respond)
    }
}

/// Runs an `async` handler in a new `Task` per request and responds when it returns; the connection
/// stays suspended meanwhile. The task starts at once on the server thread that read the request
/// (`Task.immediate`) and runs there until its first real wait (a statement, a call out), then on
/// the standard executors: a request that does not wait is answered without leaving that thread,
/// and the others skip one hand-off to an executor thread (a wake-up and two switches each).
/// Ending the work early cancels the task: its awaited calls end at once, each through its
/// cancellation handler.
package struct AsyncHTTPHandler: HTTPHandler {
    private let body: @Sendable (HTTPRequest) async -> HTTPResponse

    package init(_ body: @escaping @Sendable (HTTPRequest) async -> HTTPResponse) {
        self.body = body
    }

    package func handle(_ request: HTTPRequest, respond: @escaping @Sendable (HTTPResponse) -> Void) {
        _ = start(request, respond: respond)
    }

    package func start(_ request: HTTPRequest, respond: @escaping @Sendable (HTTPResponse) -> Void) -> (@Sendable () -> Void)? {
        let task = Task.immediate { respond(await body(request)) }
        return { task.cancel() }
    }
}
