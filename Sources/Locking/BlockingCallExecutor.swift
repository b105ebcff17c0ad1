#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A task executor over threads of its own, off the Swift concurrency pool, on which a job may make
/// a *bounded* blocking call: a database statement under its deadline runs right on the thread the
/// request's task is on (`PostgresConnection` checks `currentThreadAllowsBlocking`), instead of
/// hopping to the connection's queue and back, two thread switches a statement.
///
/// A task started with `Task(executorPreference: executor)` runs its nonisolated code here. Jobs
/// wait in one queue, first in first out; an idle thread takes the next, and a new thread is
/// started when none is idle, up to `maximumThreads` (then jobs wait for a thread to come free, so
/// a blocked thread holds up only jobs queued behind it while every other thread is busy too).
/// Threads live as long as the process. (The app API runs each request on its connection's thread
/// instead, `CallingThread`: no hand-off at all.)
package final class BlockingCallExecutor: TaskExecutor, @unchecked Sendable {
    // @unchecked: every field below `queue` is touched only with its mutex held.
    private let queue = ThreadCondition()
    private var jobs: [UnownedJob] = []
    private var head = 0
    private var threads = 0
    private var idle = 0
    package let maximumThreads: Int

    package init(maximumThreads: Int) {
        precondition(maximumThreads > 0, "an executor needs a thread")
        self.maximumThreads = maximumThreads
    }

    /// True on one of any `BlockingCallExecutor`'s threads, or inside `CallingThread.run`: a
    /// bounded blocking call may run here.
    package static var currentThreadAllowsBlocking: Bool { pthread_getspecific(threadKey) != nil }

    /// Set (to 1) on a thread where a bounded blocking call may run; `CallingThread` sets it too.
    static let threadKey: pthread_key_t = {
        var key = pthread_key_t()
        precondition(pthread_key_create(&key, nil) == 0, "pthread_key_create failed")
        return key
    }()

    package func enqueue(_ job: consuming ExecutorJob) {
        let unowned = UnownedJob(job)
        queue.lock()
        jobs.append(unowned)
        let startThread = idle == 0 && threads < maximumThreads
        if startThread { threads += 1 }
        let signal = idle > 0
        queue.unlock()
        if signal { queue.signal() }
        if startThread { spawn() }
    }

    private func spawn() {
        var thread = pthread_t()
        let context = Unmanaged.passRetained(self).toOpaque()
        let status = pthread_create(&thread, nil, { context in
            let executor = Unmanaged<BlockingCallExecutor>.fromOpaque(context!).takeRetainedValue()
            executor.run()
            return nil
        }, context)
        precondition(status == 0, "pthread_create failed: \(status)")
        pthread_detach(thread)
    }

    private func run() {
        pthread_setspecific(Self.threadKey, UnsafeRawPointer(bitPattern: 1))
        let executor = asUnownedTaskExecutor()
        while true {
            queue.lock()
            while head == jobs.count {
                idle += 1
                queue.wait()
                idle -= 1
            }
            let job = jobs[head]
            head += 1
            if head == jobs.count || head > 1024 {
                jobs.removeFirst(head)
                head = 0
            }
            queue.unlock()
            job.runSynchronously(on: executor)
        }
    }
}
