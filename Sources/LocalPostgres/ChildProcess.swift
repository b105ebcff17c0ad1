#if canImport(Glibc)
    internal import Glibc
#elseif canImport(Darwin)
    internal import Darwin
#endif

/// Runs helper programs (initdb, pg_ctl, createdb) with a bounded wait, output captured in a file.
/// posix_spawn + waitpid(WNOHANG) rather than Foundation.Process: it also works from `atexit` and
/// `deinit`, where no run loop may be available.
struct ChildProcess {
    struct Outcome {
        var exitCode: Int32
        var output: String
    }

    var executable: String
    var arguments: [String]
    /// Run as this user via `runuser -u USER --` (we are root and PostgreSQL refuses to run as root).
    var user: String?
    /// Working directory (applied with `env -C`).
    var directory: String?

    var commandLine: [String] {
        var command: [String] = []
        if let user { command += [runuserPath, "-u", user, "--"] }
        if let directory { command += ["/usr/bin/env", "-C", directory] }
        return command + [executable] + arguments
    }

    var displayName: String { executable.split(separator: "/").last.map(String.init) ?? executable }

    /// Starts the process; returns its pid and the file its stdout+stderr go to.
    func spawn() throws(LocalPostgresError) -> (pid: pid_t, outputPath: String) {
        var template = Array((temporaryFolder() + "/siwa-pg-output-XXXXXX").utf8CString)
        let outputFD = mkstemp(&template)
        guard outputFD >= 0 else { throw LocalPostgresError("mkstemp failed: errno \(errno)") }
        let outputPath = stringFromCArray(template)
        defer { close(outputFD) }

        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, outputFD, 1)
        posix_spawn_file_actions_adddup2(&actions, outputFD, 2)
        // Nothing else of ours goes along: pg_ctl starts the server, which would hold every
        // descriptor open without close-on-exec (a test's or dev's sockets, whose close then never
        // reaches the other end) for the cluster's whole life.
        for descriptor in InheritedDescriptors.aboveStandardError() {
            posix_spawn_file_actions_addclose(&actions, descriptor)
        }

        let command = commandLine
        var argv: [UnsafeMutablePointer<CChar>?] = command.map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        var pid: pid_t = 0
        let result = posix_spawn(&pid, command[0], &actions, nil, &argv, environ)
        guard result == 0 else {
            unlink(outputPath)
            throw LocalPostgresError("could not start \(command[0]): errno \(result)")
        }
        return (pid, outputPath)
    }

    /// Runs to completion, waiting at most `timeout` (then SIGKILL and an error).
    func run(timeout: Duration) async throws(LocalPostgresError) -> Outcome {
        let (pid, outputPath) = try spawn()
        let deadline = ContinuousClock.now.advanced(by: timeout)
        while true {
            if let code = Self.exitCode(of: pid) { return Self.outcome(code, outputPath) }
            if ContinuousClock.now >= deadline { break }
            try? await Task.sleep(for: .milliseconds(20))
        }
        Self.terminate(pid)
        let output = Self.outcome(-1, outputPath).output
        throw LocalPostgresError("\(displayName) did not finish within \(timeout)", output: output)
    }

    /// Blocking `run`, for `deinit` and `atexit`.
    func runBlocking(timeout: Duration) throws(LocalPostgresError) -> Outcome {
        let (pid, outputPath) = try spawn()
        let deadline = ContinuousClock.now.advanced(by: timeout)
        while true {
            if let code = Self.exitCode(of: pid) { return Self.outcome(code, outputPath) }
            if ContinuousClock.now >= deadline { break }
            usleep(20_000)
        }
        Self.terminate(pid)
        let output = Self.outcome(-1, outputPath).output
        throw LocalPostgresError("\(displayName) did not finish within \(timeout)", output: output)
    }

    /// The exit code once the child has ended (128+signal if killed), nil while it runs.
    private static func exitCode(of pid: pid_t) -> Int32? {
        var status: Int32 = 0
        let result = waitpid(pid, &status, WNOHANG)
        if result == 0 { return nil }
        if result < 0 { return errno == EINTR ? nil : -1 }
        let signal = status & 0x7f
        return signal == 0 ? (status >> 8) & 0xff : 128 + signal
    }

    private static func terminate(_ pid: pid_t) {
        _ = kill(pid, SIGKILL)
        var status: Int32 = 0
        _ = waitpid(pid, &status, 0)
    }

    private static func outcome(_ code: Int32, _ outputPath: String) -> Outcome {
        let output = readFile(outputPath) ?? ""
        unlink(outputPath)
        return Outcome(exitCode: code, output: output)
    }
}

let runuserPath = access("/usr/sbin/runuser", X_OK) == 0 ? "/usr/sbin/runuser" : "/sbin/runuser"

/// Reads a whole (small) file, nil if it cannot be opened.
func readFile(_ path: String) -> String? {
    guard let file = fopen(path, "r") else { return nil }
    defer { fclose(file) }
    var bytes: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 4096)
    while true {
        let count = fread(&buffer, 1, buffer.count, file)
        if count <= 0 { break }
        bytes += buffer[0..<count]
    }
    return String(decoding: bytes, as: UTF8.self)
}

/// The text of a NUL-terminated `[CChar]` buffer (mkstemp/mkdtemp templates).
func stringFromCArray(_ array: [CChar]) -> String {
    String(decoding: array.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}
