internal import CLibpq
import Locking

#if canImport(Glibc)
    internal import Glibc
#endif

/// What a statement's next step found (`PostgresConnection.awaitReply`).
enum ReplyStage: Sendable {
    /// Nothing was sent (the statement is not prepared on this session yet, or the session sends
    /// everything unnamed): the caller prepares it, or takes the queue's path.
    case declined
    /// Its every result is in.
    case complete
    /// The socket has something to read (or has failed): look again.
    case readable
}

/// The one thread that waits for PostgreSQL's replies to statements sent from tasks.
///
/// A task sends its statement on its own thread and suspends; this thread waits on every such
/// socket at once (one epoll set, each socket armed for a single wake-up) and resumes the task,
/// which reads the reply where it resumes. A statement then costs this thread's wake-up, shared by
/// every reply that came in meanwhile, where a connection's own queue thread woke for the send and
/// again for the reply. It reads nothing itself.
///
/// It resumes a task under its lock, and the task passes through that lock after its wait
/// (`passThrough`): a resume that comes before the task has suspended is otherwise an order
/// ThreadSanitizer cannot see (`QueueHandOff` says why), and it reported `resume`'s read of the
/// task's frame against the task's next write there.
///
/// Linux only (epoll); elsewhere `shared` is nil and every statement takes its connection's queue.
final class ReplyWatcher: Sendable {
    /// Nil when the epoll set or its thread could not be made (out of descriptors or threads at the
    /// first statement): statements then wait on their connection's queue, as before.
    static let shared: ReplyWatcher? = ReplyWatcher()

    private let epoll: Int32
    /// The task waiting on each socket, by descriptor: a socket has one statement in flight at a time.
    private let waiting = Locked<[Int32: UnsafeContinuation<ReplyStage, any Error>]>([:])

    private init?() {
        #if canImport(Glibc)
            epoll = epoll_create1(Int32(EPOLL_CLOEXEC))
            guard epoll >= 0 else { return nil }
            var thread = pthread_t()
            let status = pthread_create(&thread, nil, { _ in
                ReplyWatcher.shared?.run()
                return nil
            }, nil)
            guard status == 0 else {
                close(epoll)
                return nil
            }
            pthread_detach(thread)
        #else
            return nil
        #endif
    }

    /// Resumes `continuation` with `.readable` once `socket` can be read (or fails). Returns the
    /// errno of a socket that cannot be watched (nothing was stored then), 0 otherwise.
    func resumeWhenReadable(_ socket: Int32, _ continuation: UnsafeContinuation<ReplyStage, any Error>) -> Int32 {
        #if canImport(Glibc)
            waiting.withLock { $0[socket] = continuation }
            var event = epoll_event()
            event.events = EPOLLIN.rawValue | EPOLLONESHOT.rawValue
            event.data.fd = socket
            // Armed once per wait: MOD re-arms a socket watched before, ADD a new one (a closed
            // socket leaves the set by itself, so its number may come back as a new socket).
            var outcome = epoll_ctl(epoll, EPOLL_CTL_MOD, socket, &event)
            if outcome != 0, errno == ENOENT { outcome = epoll_ctl(epoll, EPOLL_CTL_ADD, socket, &event) }
            if outcome == 0 { return 0 }
            let failure = errno
            waiting.withLock { _ = $0.removeValue(forKey: socket) }
            return failure
        #else
            return ENOSYS
        #endif
    }

    /// In the task, after a wait this watcher ended: see the type's comment.
    func passThrough() { waiting.withLock { _ in } }

    private func run() {
        #if canImport(Glibc)
            let capacity = 64
            let events = UnsafeMutablePointer<epoll_event>.allocate(capacity: capacity)
            while true {
                let count = epoll_wait(epoll, events, Int32(capacity), -1)
                guard count > 0 else { continue }  // EINTR
                for index in 0..<Int(count) {
                    let socket = events[index].data.fd
                    waiting.withLock { $0.removeValue(forKey: socket)?.resume(returning: .readable) }
                }
            }
        #endif
    }
}
