import ChildProcesses

#if canImport(Glibc)
    internal import Glibc
#elseif canImport(Darwin)
    internal import Darwin
#endif

/// A helper program (initdb, pg_ctl, createdb, psql) run to completion with a bounded wait, its
/// stdout and stderr captured in a file, through `ChildProcess`.
struct HelperProgram {
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

    private func start() throws(LocalPostgresError) -> (ChildProcess, outputPath: String) {
        var template = Array((temporaryFolder() + "/siwa-pg-output-XXXXXX").utf8CString)
        let outputFD = mkstemp(&template)
        guard outputFD >= 0 else { throw LocalPostgresError("mkstemp failed: errno \(errno)") }
        close(outputFD)
        let outputPath = stringFromCArray(template)
        let command = commandLine
        do {
            let child = try ChildProcess(command[0], Array(command.dropFirst()), options: .init(output: .file(outputPath)))
            return (child, outputPath)
        } catch {
            unlink(outputPath)
            throw LocalPostgresError("could not start \(command[0]): \(error)")
        }
    }

    /// Runs to completion, waiting at most `timeout` (then SIGKILL and an error).
    func run(timeout: Duration) async throws(LocalPostgresError) -> Outcome {
        let (child, outputPath) = try start()
        let ended = await child.waitForExit(timeout: timeout)
        return try finish(child, ended, outputPath, timeout)
    }

    /// Blocking `run`, for `deinit` and `atexit`.
    func runBlocking(timeout: Duration) throws(LocalPostgresError) -> Outcome {
        let (child, outputPath) = try start()
        let ended = child.waitForExitBlocking(timeout: timeout)
        return try finish(child, ended, outputPath, timeout)
    }

    private func finish(_ child: ChildProcess, _ ended: ChildProcess.Termination?, _ outputPath: String, _ timeout: Duration)
        throws(LocalPostgresError) -> Outcome
    {
        let output = readFile(outputPath) ?? ""
        unlink(outputPath)
        guard let ended else {
            child.signal(SIGKILL)
            _ = child.waitForExitBlocking(timeout: .seconds(10))
            throw LocalPostgresError("\(displayName) did not finish within \(timeout)", output: output)
        }
        return Outcome(exitCode: ended.code, output: output)
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
