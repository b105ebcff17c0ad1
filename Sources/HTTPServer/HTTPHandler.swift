import Locking

/// Answers requests. `respond` must be called exactly once, from any thread, now or later (for
/// example after a database commit). Until it is called the connection is suspended: it holds no
/// server thread. Calls after the first are ignored.
package protocol HTTPHandler: Sendable {
    func handle(_ request: HTTPRequest, respond: @escaping @Sendable (HTTPResponse) -> Void)
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

/// Runs an `async` handler in a new `Task` per request and responds when it returns; the
/// connection stays suspended meanwhile. With an `executor`, the task prefers it (its nonisolated
/// code runs on that executor's threads rather than the Swift concurrency pool's).
package struct AsyncHTTPHandler: HTTPHandler {
    private let body: @Sendable (HTTPRequest) async -> HTTPResponse
    private let executor: (any TaskExecutor)?

    package init(executor: (any TaskExecutor)? = nil, _ body: @escaping @Sendable (HTTPRequest) async -> HTTPResponse) {
        self.body = body
        self.executor = executor
    }

    package func handle(_ request: HTTPRequest, respond: @escaping @Sendable (HTTPResponse) -> Void) {
        Task(executorPreference: executor) { respond(await body(request)) }
    }
}

/// Runs an `async` handler to its end on the server thread that received the request, blocking it
/// meanwhile (`CallingThread.run`): only for a server with a thread per connection.
struct CallingThreadHTTPHandler: HTTPHandler {
    private let body: @Sendable (HTTPRequest) async -> HTTPResponse

    init(_ body: @escaping @Sendable (HTTPRequest) async -> HTTPResponse) {
        self.body = body
    }

    func handle(_ request: HTTPRequest, respond: @escaping @Sendable (HTTPResponse) -> Void) {
        respond(CallingThread.run { await body(request) })
    }
}
