#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// One thread that runs actions at their deadlines: the bounds of the pool's lease waits and of
/// statements run under `PostgresConnection.statementTimeout`. A wait bounded this way costs an
/// entry in a table (no task, no timer source, no wake-up) unless its deadline comes; the thread
/// wakes at the earliest deadline, or once a second when none is sooner, and is signalled only for
/// a deadline earlier than the wake-up it has planned.
///
/// An action runs on the timer's thread, with no lock held: it must be short and must not block
/// (deliver an outcome, send a cancel request).
final class DeadlineTimer: @unchecked Sendable {
    // @unchecked: every field below `mutex` is touched only with it held.
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private let wake: UnsafeMutablePointer<pthread_cond_t>
    private var entries: [UInt64: (deadline: UInt64, action: @Sendable () -> Void)] = [:]
    private var nextID: UInt64 = 0
    /// Monotonic nanoseconds of the wake-up the thread sleeps towards (0: not sleeping).
    private var plannedWake: UInt64 = 0
    private var started = false

    static let shared = DeadlineTimer()

    private init() {
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        wake = .allocate(capacity: 1)
        wake.initialize(to: pthread_cond_t())
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        precondition(pthread_mutex_init(mutex, nil) == 0 && pthread_cond_init(wake, &attributes) == 0, "pthread init failed")
        pthread_condattr_destroy(&attributes)
    }

    /// Monotonic nanoseconds now.
    static func now() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
    }

    static func nanoseconds(_ duration: Duration) -> UInt64 {
        let (seconds, attoseconds) = duration.components
        guard seconds >= 0 else { return 0 }
        return UInt64(seconds) * 1_000_000_000 + UInt64(attoseconds / 1_000_000_000)
    }

    /// Runs `action` once `after` has passed, unless `cancel` comes first. Returns the entry's id.
    func schedule(after: Duration, _ action: @escaping @Sendable () -> Void) -> UInt64 {
        let deadline = Self.now() &+ Self.nanoseconds(after)
        pthread_mutex_lock(mutex)
        nextID &+= 1
        let id = nextID
        entries[id] = (deadline, action)
        let start = !started
        started = true
        let signal = plannedWake != 0 && deadline < plannedWake
        pthread_mutex_unlock(mutex)
        if start { spawn() }
        if signal { pthread_cond_signal(wake) }
        return id
    }

    /// Removes the entry; true when its action had not run (and now never will).
    @discardableResult
    func cancel(_ id: UInt64) -> Bool {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return entries.removeValue(forKey: id) != nil
    }

    private func spawn() {
        var thread = pthread_t()
        let status = pthread_create(&thread, nil, { _ in
            DeadlineTimer.shared.run()
            return nil
        }, nil)
        precondition(status == 0, "pthread_create failed: \(status)")
        pthread_detach(thread)
    }

    private func run() {
        var due: [@Sendable () -> Void] = []
        while true {
            pthread_mutex_lock(mutex)
            let now = Self.now()
            var earliest = now + 1_000_000_000
            for (id, entry) in entries {
                if entry.deadline <= now {
                    due.append(entry.action)
                    entries[id] = nil
                } else if entry.deadline < earliest {
                    earliest = entry.deadline
                }
            }
            if due.isEmpty {
                plannedWake = earliest
                var until = timespec(tv_sec: Int(earliest / 1_000_000_000), tv_nsec: Int(earliest % 1_000_000_000))
                _ = pthread_cond_timedwait(wake, mutex, &until)
                plannedWake = 0
            }
            pthread_mutex_unlock(mutex)
            for action in due { action() }
            due.removeAll(keepingCapacity: true)
        }
    }
}
