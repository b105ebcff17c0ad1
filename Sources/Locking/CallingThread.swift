#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Runs an `async` body to its end on the thread that calls `run`, which waits meanwhile: for a
/// thread that exists to serve one request at a time and may block (a thread-per-connection
/// server's). The body's task prefers an executor whose jobs this thread runs itself, and the
/// thread counts as one where a bounded blocking call may run (`BlockingCallExecutor
/// .currentThreadAllowsBlocking`), so the request's database statements and HTTP calls run right
/// here: from the request's bytes to its answer, no thread switch unless the body waits on
/// something that resumes it from elsewhere (an actor, a timer), and then one wake-up of this thread.
package enum CallingThread {
    package static func run<Result: Sendable>(_ body: @escaping @Sendable () async -> Result) -> Result {
        let executor = CallingThreadExecutor.take()
        let outcome = Outcome<Result>()
        let previous = pthread_getspecific(BlockingCallExecutor.threadKey)
        pthread_setspecific(BlockingCallExecutor.threadKey, UnsafeRawPointer(bitPattern: 1))
        executor.begin()
        // The task's first job is queued on `executor` before `Task.init` returns.
        Task(executorPreference: executor) {
            let result = await body()
            outcome.value = result
            executor.finish()
        }
        executor.runJobsUntilFinished()
        pthread_setspecific(BlockingCallExecutor.threadKey, previous)
        CallingThreadExecutor.giveBack(executor)
        // `finish()` was called after the write, and `runJobsUntilFinished` saw it under the same
        // mutex: the write happened before this read.
        return outcome.value!
    }

    /// The body's result, written once by the task, read once after it finished.
    private final class Outcome<Value>: @unchecked Sendable {
        var value: Value?
    }
}

/// The executor `CallingThread.run` lends a body's task. Executors are kept for reuse and never
/// freed: a task's executor preference does not own the executor, and a job of a task that outlived
/// its `run` (an unstructured task inheriting the preference) may still be queued on it later. Such
/// a job, arriving while no thread runs this executor's jobs, goes to the global concurrent executor.
final class CallingThreadExecutor: TaskExecutor, @unchecked Sendable {
    // @unchecked: every field below `queue` is touched only with its mutex held.
    private let queue = ThreadCondition()
    private var jobs: [UnownedJob] = []
    private var running = false
    private var finished = false

    private static let spare = Locked<[CallingThreadExecutor]>([])

    static func take() -> CallingThreadExecutor {
        spare.withLock { $0.popLast() } ?? CallingThreadExecutor()
    }

    static func giveBack(_ executor: CallingThreadExecutor) {
        spare.withLock { $0.append(executor) }
    }

    private init() {
        jobs.reserveCapacity(8)
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let unowned = UnownedJob(job)
        queue.lock()
        let kept = running
        if kept { jobs.append(unowned) }
        queue.unlock()
        if kept {
            queue.signal()
        } else {
            globalConcurrentExecutor.enqueue(ExecutorJob(unowned))
        }
    }

    func begin() {
        queue.lock()
        running = true
        finished = false
        queue.unlock()
    }

    /// Called by the body's task once its result is written.
    func finish() {
        queue.lock()
        finished = true
        queue.unlock()
        queue.signal()
    }

    /// Runs queued jobs, in order, until `finish()` has been called and none is left; from then on
    /// `enqueue` sends jobs to the global concurrent executor.
    func runJobsUntilFinished() {
        let executor = asUnownedTaskExecutor()
        var next = 0
        while true {
            queue.lock()
            while next == jobs.count && !finished { queue.wait() }
            if next == jobs.count {
                jobs.removeAll(keepingCapacity: true)
                running = false
                queue.unlock()
                return
            }
            let job = jobs[next]
            next += 1
            queue.unlock()
            job.runSynchronously(on: executor)
        }
    }
}
