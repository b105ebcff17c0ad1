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
    // @unchecked: every field below `mutex` is touched only with it held.
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private let wake: UnsafeMutablePointer<pthread_cond_t>
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
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        wake = .allocate(capacity: 1)
        wake.initialize(to: pthread_cond_t())
        precondition(pthread_mutex_init(mutex, nil) == 0 && pthread_cond_init(wake, nil) == 0, "pthread init failed")
        jobs.reserveCapacity(8)
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let unowned = UnownedJob(job)
        pthread_mutex_lock(mutex)
        let kept = running
        if kept { jobs.append(unowned) }
        pthread_mutex_unlock(mutex)
        if kept {
            pthread_cond_signal(wake)
        } else {
            globalConcurrentExecutor.enqueue(ExecutorJob(unowned))
        }
    }

    func begin() {
        pthread_mutex_lock(mutex)
        running = true
        finished = false
        pthread_mutex_unlock(mutex)
    }

    /// Called by the body's task once its result is written.
    func finish() {
        pthread_mutex_lock(mutex)
        finished = true
        pthread_mutex_unlock(mutex)
        pthread_cond_signal(wake)
    }

    /// Runs queued jobs, in order, until `finish()` has been called and none is left; from then on
    /// `enqueue` sends jobs to the global concurrent executor.
    func runJobsUntilFinished() {
        let executor = asUnownedTaskExecutor()
        var next = 0
        while true {
            pthread_mutex_lock(mutex)
            while next == jobs.count && !finished { pthread_cond_wait(wake, mutex) }
            if next == jobs.count {
                jobs.removeAll(keepingCapacity: true)
                running = false
                pthread_mutex_unlock(mutex)
                return
            }
            let job = jobs[next]
            next += 1
            pthread_mutex_unlock(mutex)
            job.runSynchronously(on: executor)
        }
    }
}
