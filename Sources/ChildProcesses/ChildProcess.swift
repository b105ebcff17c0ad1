import Locking

#if canImport(Glibc)
    internal import Glibc
#elseif canImport(Darwin)
    internal import Darwin
#endif

/// A child process, from spawn to reaped: the one way this code base starts one (`siwa dev`'s
/// services, PostgreSQL's programs, the tests' services, CLI runs, browsers, scripts).
///
/// It is the only reaper of its child: `waitpid` is called here alone, under the same lock as every
/// `kill`. A pid stays ours until it is reaped (the zombie holds the number), so a signal sent while
/// the lock says "not reaped" can only reach our child, never a process that later got the same pid
/// (pids wrap within minutes on a machine where every PostgreSQL connection forks). Nothing else may
/// `kill` or `waitpid` a pid taken from here.
///
/// posix_spawn rather than Foundation's `Process`: it works from `atexit` and `deinit`, closes every
/// descriptor of ours in the child, and nothing else reaps behind our back.
///
/// Dies with us: unless told otherwise, the pid is registered with `OrphanReaper` (a watchdog that
/// stops what is still registered when this process dies, SIGKILL included) and forgotten once reaped.
package final class ChildProcess: Sendable {
    /// Where the child's standard input comes from.
    package enum Input: Sendable {
        /// `/dev/null`: reads end at once.
        case none
        /// These bytes, then end of file: fed through an unlinked temporary file, so the child sees
        /// all of them and then EOF whatever it reads when, and no thread of ours has to stay to feed it.
        case text(String)
        /// A descriptor of ours (the watchdog's pipe); the caller keeps and closes it.
        case descriptor(Int32)
    }

    /// Where the child's stdout or stderr goes.
    package enum Output: Sendable {
        case discard
        /// Created or truncated.
        case file(String)
        /// A pipe whose read end this object holds (`readOutput`, `closeOutput`, `takeOutputDescriptor`).
        /// stdout only; as stderr, it means "the same pipe as stdout".
        case pipe
        /// stderr only: the same descriptor as stdout (one file offset for both).
        case sameAsOutput
    }

    package struct Options: Sendable {
        /// nil: this process's environment; otherwise exactly these variables.
        package var environment: [String: String]?
        package var input: Input
        package var output: Output
        package var error: Output
        /// A process group of its own, so a terminal's Ctrl-C reaches only us (we stop it in order).
        package var ownProcessGroup: Bool
        /// Registered with `OrphanReaper` until reaped (false only for the watchdog itself).
        package var diesWithUs: Bool

        package init(
            environment: [String: String]? = nil, input: Input = .none, output: Output = .discard,
            error: Output = .sameAsOutput, ownProcessGroup: Bool = false, diesWithUs: Bool = true
        ) {
            self.environment = environment
            self.input = input
            self.output = output
            self.error = error
            self.ownProcessGroup = ownProcessGroup
            self.diesWithUs = diesWithUs
        }
    }

    /// How a child ended.
    package enum Termination: Sendable, Equatable, CustomStringConvertible {
        case exit(Int32)
        case signal(Int32)

        /// The exit code, or 128 + the signal's number (as a shell reports it).
        package var code: Int32 {
            switch self {
            case .exit(let code): code
            case .signal(let number): 128 + number
            }
        }

        package var description: String {
            switch self {
            case .exit(let code): "exit \(code)"
            case .signal(let number): "signal \(number)"
            }
        }
    }

    package let pid: Int32
    package let executable: String
    private let state: Locked<State>
    private let diesWithUs: Bool

    private struct State {
        var termination: Termination?
        var peakKilobytes = 0
        var outputDescriptor: Int32 = -1
    }

    package init(_ executable: String, _ arguments: [String] = [], options: Options = Options()) throws(ChildProcessError) {
        self.executable = executable
        diesWithUs = options.diesWithUs
        let (pid, outputRead) = try Self.spawn(executable, arguments, options)
        self.pid = pid
        state = Locked(State(outputDescriptor: outputRead))
        if diesWithUs { OrphanReaper.shared?.watch(pid: pid) }
    }

    deinit {
        // Not reaped means still ours: kill and reap, so no zombie and no orphan is left.
        state.withLock { state in
            if state.outputDescriptor >= 0 { close(state.outputDescriptor) }
            state.outputDescriptor = -1
            guard reap(&state, blocking: false) == nil else { return }
            _ = kill(pid, SIGKILL)
            _ = reap(&state, blocking: true)
        }
    }

    /// How it ended, once it has (reaping it then); nil while it runs.
    package var termination: Termination? { state.withLock { reap(&$0, blocking: false) } }

    /// The exit code once ended (128 + signal when killed), nil while it runs.
    package var exitCode: Int32? { termination?.code }
    package var isRunning: Bool { termination == nil }
    /// The child's own peak resident memory in kB (wait4's ru_maxrss), 0 until reaped.
    package var peakKilobytes: Int { state.withLock { $0.peakKilobytes } }

    /// Sends `number` if, and only if, the child has not been reaped: checked under the lock that
    /// reaping takes, so the pid cannot be anyone else's. False when it had already ended.
    @discardableResult
    package func signal(_ number: Int32) -> Bool {
        let sent = state.withLock { state -> Bool in
            guard reap(&state, blocking: false) == nil else { return false }
            return kill(pid, number) == 0
        }
        return sent
    }

    /// Waits (polling, without holding a thread) at most `timeout` for the child to end.
    package func waitForExit(timeout: Duration) async -> Termination? {
        let deadline = ContinuousClock.now + timeout
        while true {
            if let termination { return termination }
            if ContinuousClock.now >= deadline { return termination }
            try? await Task.sleep(for: .milliseconds(20))
        }
    }

    /// `waitForExit` for `deinit` and `atexit`, where no task may run.
    package func waitForExitBlocking(timeout: Duration) -> Termination? {
        let deadline = ContinuousClock.now + timeout
        while true {
            if let termination { return termination }
            if ContinuousClock.now >= deadline { return termination }
            usleep(20_000)
        }
    }

    /// `first` (SIGTERM unless told), up to `grace` to end, then SIGKILL and a wait for the reap
    /// (bounded by `grace` again: a SIGKILLed process ends unless stuck in the kernel).
    @discardableResult
    package func stop(_ first: Int32 = SIGTERM, grace: Duration) async -> Termination? {
        signal(first)
        if let ended = await waitForExit(timeout: grace) { return ended }
        signal(SIGKILL)
        return await waitForExit(timeout: grace)
    }

    /// Blocking `stop`, for `deinit` and `atexit`.
    @discardableResult
    package func stopBlocking(grace: Duration) -> Termination? {
        signal(SIGTERM)
        if let ended = waitForExitBlocking(timeout: grace) { return ended }
        signal(SIGKILL)
        return waitForExitBlocking(timeout: grace)
    }

    /// What the stdout pipe holds now, without blocking: bytes, empty when nothing is there yet,
    /// nil at its end (the child and every holder of the write end closed it) or when closed here.
    package func readOutput() -> [UInt8]? {
        state.withLock { state in
            guard state.outputDescriptor >= 0 else { return nil }
            let descriptor = state.outputDescriptor
            _ = fcntl(descriptor, F_SETFL, fcntl(descriptor, F_GETFL) | O_NONBLOCK)
            var buffer = [UInt8](repeating: 0, count: 65_536)
            let count = read(descriptor, &buffer, buffer.count)
            if count > 0 { return Array(buffer[0..<count]) }
            if count < 0 && (errno == EAGAIN || errno == EINTR) { return [] }
            return nil
        }
    }

    /// Closes our end of the stdout pipe, as `cmd | head -1` does once it has its line.
    package func closeOutput() {
        state.withLock { state in
            if state.outputDescriptor >= 0 { close(state.outputDescriptor) }
            state.outputDescriptor = -1
        }
    }

    /// Hands the stdout pipe's read end to the caller, who then closes it (a reader thread).
    package func takeOutputDescriptor() -> Int32? {
        state.withLock { state in
            defer { state.outputDescriptor = -1 }
            return state.outputDescriptor >= 0 ? state.outputDescriptor : nil
        }
    }

    // MARK: The one waitpid

    /// Reaps the child if it has ended (or, `blocking`, once it does) and records how it ended.
    /// Called with the state's lock held, and only from here. The watchdog is told to forget the
    /// pid before the reap frees the number: told after, it could forget a newer child that got it.
    private func reap(_ state: inout State, blocking: Bool) -> Termination? {
        if let known = state.termination { return known }
        var info = siginfo_t()
        while waitid(P_PID, id_t(pid), &info, WEXITED | WNOWAIT | (blocking ? 0 : WNOHANG)) != 0 {
            guard errno == EINTR else {
                // ECHILD: nothing else reaps our children, so SIGCHLD is ignored and the kernel
                // reaped it; it has ended either way.
                state.termination = .exit(-1)
                if diesWithUs { OrphanReaper.shared?.forget(pid: pid) }
                return state.termination
            }
        }
        guard info._sifields._kill.si_pid == pid else { return nil }  // still running
        if diesWithUs { OrphanReaper.shared?.forget(pid: pid) }
        var status: Int32 = 0
        var usage = rusage()
        while wait4(pid, &status, 0, &usage) < 0 && errno == EINTR {}
        let signal = status & 0x7f
        state.termination = signal == 0 ? .exit((status >> 8) & 0xff) : .signal(signal)
        state.peakKilobytes = usage.ru_maxrss
        return state.termination
    }

    // MARK: Spawning

    /// Held from a spawn's first descriptor to the child's start: each spawn closes, in its child,
    /// every descriptor open when it looked, so descriptors made for one child must be close-on-exec
    /// before another spawn can look. It counts the spawns rather than hold nothing: a
    /// `Locked(())`'s empty value sits where ThreadSanitizer takes an access to it for a write to
    /// the object's header, and reported a race that is not there (`deploy/sanitize.sh thread`).
    private static let spawning = Locked<UInt64>(0)

    private static func spawn(_ executable: String, _ arguments: [String], _ options: Options)
        throws(ChildProcessError) -> (pid: Int32, outputRead: Int32)
    {
        try spawning.withLock { (spawns) throws(ChildProcessError) in
            spawns &+= 1
            return try spawnLocked(executable, arguments, options)
        }
    }

    private static func spawnLocked(_ executable: String, _ arguments: [String], _ options: Options)
        throws(ChildProcessError) -> (pid: Int32, outputRead: Int32)
    {
        if case .sameAsOutput = options.output { throw ChildProcessError("stdout cannot be the same as stdout") }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        // Descriptors of ours the child gets as 0, 1 or 2; closed here once it has them.
        var parentEnds: [Int32] = []
        defer { parentEnds.forEach { close($0) } }
        var outputRead: Int32 = -1

        switch options.input {
        case .none:
            posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        case .text(let text):
            let descriptor = try unlinkedFile(holding: text)
            parentEnds.append(descriptor)
            posix_spawn_file_actions_adddup2(&actions, descriptor, 0)
        case .descriptor(let descriptor):
            posix_spawn_file_actions_adddup2(&actions, descriptor, 0)
        }
        for (output, target) in [(options.output, Int32(1)), (options.error, Int32(2))] {
            switch output {
            case .discard:
                posix_spawn_file_actions_addopen(&actions, target, "/dev/null", O_WRONLY, 0)
            case .file(let path):
                posix_spawn_file_actions_addopen(&actions, target, path, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
            case .pipe where target == 1:
                var ends: [Int32] = [0, 0]
                // Close-on-exec before any other spawn (they wait on `spawning`): another child
                // must not hold our pipe open, or its reader never sees the end.
                guard pipe(&ends) == 0 else { throw ChildProcessError("pipe failed: errno \(errno)") }
                ends.forEach { _ = fcntl($0, F_SETFD, FD_CLOEXEC) }
                outputRead = ends[0]
                parentEnds.append(ends[1])
                posix_spawn_file_actions_adddup2(&actions, ends[1], 1)
            case .pipe, .sameAsOutput:
                posix_spawn_file_actions_adddup2(&actions, 1, target)
            }
        }
        // Nothing else of ours goes along: a long-lived child (pg_ctl's server, a `siwa dev`
        // service, the watchdog) holding one of our sockets keeps it open after we closed it.
        for descriptor in InheritedDescriptors.aboveStandardError() where !parentEnds.contains(descriptor) {
            posix_spawn_file_actions_addclose(&actions, descriptor)
        }

        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        // Default dispositions for the signals a parent (`siwa dev`, the watchdog) ignores, and an
        // empty mask: the child answers SIGTERM and SIGINT whatever its parent does with them.
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for signal in [SIGINT, SIGTERM, SIGPIPE, SIGHUP, SIGQUIT] { sigaddset(&defaults, signal) }
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        var mask = sigset_t()
        sigemptyset(&mask)
        posix_spawnattr_setsigmask(&attributes, &mask)
        var flags = POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK
        if options.ownProcessGroup {
            posix_spawnattr_setpgroup(&attributes, 0)
            flags |= POSIX_SPAWN_SETPGROUP
        }
        posix_spawnattr_setflags(&attributes, Int16(flags))

        let argv: [UnsafeMutablePointer<CChar>?] = ([executable] + arguments).map { strdup($0) } + [nil]
        let envp: [UnsafeMutablePointer<CChar>?]? = options.environment.map { environment in
            environment.sorted { $0.key < $1.key }.map { strdup("\($0.key)=\($0.value)") } + [nil]
        }
        defer {
            argv.forEach { free($0) }
            envp?.forEach { free($0) }
        }
        var pid: pid_t = 0
        let result =
            if let envp { posix_spawn(&pid, executable, &actions, &attributes, argv, envp) } else {
                posix_spawn(&pid, executable, &actions, &attributes, argv, environ)
            }
        guard result == 0 else {
            if outputRead >= 0 { close(outputRead) }
            throw ChildProcessError("could not start \(executable): \(String(cString: strerror(result)))")
        }
        return (pid, outputRead)
    }

    /// A file already unlinked, holding `text`, positioned at its start (close-on-exec).
    private static func unlinkedFile(holding text: String) throws(ChildProcessError) -> Int32 {
        var template = Array((temporaryFolder() + "/siwa-stdin-XXXXXX").utf8CString)
        let descriptor = mkstemp(&template)
        guard descriptor >= 0 else { throw ChildProcessError("mkstemp failed: errno \(errno)") }
        _ = fcntl(descriptor, F_SETFD, FD_CLOEXEC)
        unlink(String(decoding: template.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
        let bytes = Array(text.utf8)
        var offset = 0
        while offset < bytes.count {
            let written = bytes[offset...].withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
            if written < 0 && errno == EINTR { continue }
            guard written > 0 else {
                close(descriptor)
                throw ChildProcessError("could not write the child's input: errno \(errno)")
            }
            offset += written
        }
        lseek(descriptor, 0, SEEK_SET)
        return descriptor
    }
}

/// Why a child could not be started.
package struct ChildProcessError: Error, CustomStringConvertible {
    package var description: String
    package init(_ description: String) { self.description = description }
}
