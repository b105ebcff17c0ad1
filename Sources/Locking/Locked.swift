#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A value behind a pthread mutex, with the API of `Synchronization.Mutex` (`withLock`).
///
/// Why not `Mutex`: on Linux it is built on raw futex calls that ThreadSanitizer cannot see, so
/// every access under it is reported as a race and real races hide among the false ones. A
/// pthread mutex is intercepted by the sanitizer, so `deploy/sanitize.sh` reports only real races.
/// Hold a value, never `()`: an empty value's accesses land on the object's header, which the
/// sanitizer then reports as racing with reads of that header (a count will do, as in
/// `QueueHandOff` and `ChildProcess`).
package final class Locked<Value>: @unchecked Sendable {
    // @unchecked: `value` is only touched between pthread_mutex_lock and pthread_mutex_unlock.
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private var value: Value

    package init(_ value: Value) {
        self.value = value
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        let status = pthread_mutex_init(mutex, nil)
        precondition(status == 0, "pthread_mutex_init failed: \(status)")
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deinitialize(count: 1)
        mutex.deallocate()
    }

    package func withLock<Result, Failure: Error>(_ body: (inout Value) throws(Failure) -> Result) throws(Failure) -> Result {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&value)
    }
}
