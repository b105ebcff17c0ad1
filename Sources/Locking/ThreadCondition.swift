#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A pthread mutex and condition variable at fixed addresses: the job queues of the executors here,
/// whose idle threads wait on it (they are not tasks, so a `Locked` value could not wake them).
/// Never freed: its executors live as long as the process.
struct ThreadCondition: @unchecked Sendable {
    // @unchecked: the pointers never change, and pthread's calls are what make them shareable.
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private let condition: UnsafeMutablePointer<pthread_cond_t>

    init() {
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        condition = .allocate(capacity: 1)
        condition.initialize(to: pthread_cond_t())
        precondition(pthread_mutex_init(mutex, nil) == 0 && pthread_cond_init(condition, nil) == 0, "pthread init failed")
    }

    func lock() { pthread_mutex_lock(mutex) }
    func unlock() { pthread_mutex_unlock(mutex) }
    /// Releases the mutex (held by the caller), waits for `signal`, and takes the mutex again.
    func wait() { pthread_cond_wait(condition, mutex) }
    func signal() { pthread_cond_signal(condition) }
}
