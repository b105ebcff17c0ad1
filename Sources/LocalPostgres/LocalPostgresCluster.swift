package import Logging
import Locking
import ChildProcesses

#if canImport(Glibc)
    internal import Glibc
#elseif canImport(Darwin)
    internal import Darwin
#endif

/// A throwaway PostgreSQL cluster: initdb in a fresh temp directory, a free TCP port on 127.0.0.1,
/// the unix socket in the temp directory, trust authentication for user `postgres` (or, with
/// `Options.password`, a password over TCP and the socket in the private folder only). For tests,
/// `siwa dev` and benchmarks. When running as root (CI), the server programs run as the `postgres`
/// system user through `runuser`, on a directory that user owns. Every wait is bounded.
package final class LocalPostgresCluster: Sendable {
    package struct Options: Sendable {
        /// false for tests (also turns off synchronous_commit and full_page_writes); benchmarks want true.
        package var fsync: Bool
        package var database: String
        package var maxConnections: Int
        package var sharedBuffers: String
        /// Extra `postgresql.conf` settings, e.g. `["log_min_duration_statement": "0"]`.
        package var settings: [String: String]
        /// Bound on `pg_ctl start`/`stop` (`-t`) and on initdb.
        package var timeout: Duration
        /// When set, TCP connections must give this password (scram-sha-256) and only the unix
        /// socket, in the 0700 directory, is trusted: no other local user gets in (`siwa dev`).
        package var password: String?

        package init(
            fsync: Bool = false, database: String = "siwa", maxConnections: Int = 200, sharedBuffers: String = "128MB",
            settings: [String: String] = [:], timeout: Duration = .seconds(60), password: String? = nil
        ) {
            self.password = password
            self.fsync = fsync
            self.database = database
            self.maxConnections = maxConnections
            self.sharedBuffers = sharedBuffers
            self.settings = settings
            self.timeout = timeout
        }
    }

    /// Folder of initdb, pg_ctl, postgres, psql, pgbench.
    package let binDirectory: String
    /// The temp directory (data directory, socket and server log inside).
    package let directory: String
    package let dataDirectory: String
    package let logPath: String
    package let port: Int
    package let database: String
    package let options: Options
    let user: String?
    let logger: Logger
    private let state = Locked(State())

    private struct State {
        var running = false
        var destroyed = false
    }

    /// `postgresql://postgres@127.0.0.1:PORT/DB` (`postgres:PASSWORD@` with a password)
    package var url: String {
        "postgresql://postgres\(options.password.map { ":" + $0 } ?? "")@127.0.0.1:\(port)/\(database)"
    }
    /// `host=127.0.0.1 port=PORT user=postgres dbname=DB` (and `password=...`)
    package var conninfo: String {
        "host=127.0.0.1 port=\(port) user=postgres dbname=\(database)" + (options.password.map { " password=\($0)" } ?? "")
    }
    package var isRunning: Bool { state.withLock { $0.running } }

    init(
        binDirectory: String, directory: String, port: Int, user: String?, options: Options, logger: Logger
    ) {
        self.binDirectory = binDirectory
        self.directory = directory
        self.dataDirectory = directory + "/data"
        self.logPath = directory + "/server.log"
        self.port = port
        self.database = options.database
        self.options = options
        self.user = user
        self.logger = logger
        // From here on the folder (and the server, once started) goes with this process, however
        // it ends.
        OrphanReaper.shared?.watch(clusterIn: directory, pgCtl: binDirectory + "/pg_ctl", user: user)
    }

    deinit {
        // Best effort: an undestroyed cluster must not outlive its owner.
        if !state.withLock({ $0.destroyed }) { destroyBlocking() }
    }

    /// Creates, starts and returns a new cluster with a database `options.database`.
    package static func start(logger: Logger, options: Options = Options()) async throws -> LocalPostgresCluster {
        // The port is free when chosen but not reserved: an outgoing connection or another
        // process may take it before the server binds. That loses the race, not the run: a fresh
        // cluster on a fresh port.
        try await onFreshPorts(logger: logger) { try await startOnce(logger: logger, options: options) }
    }

    /// `start` again, up to three times in all, while the server finds its port taken
    /// (`PortTaken`); the last attempt's own error then.
    package static func onFreshPorts<Started>(logger: Logger, _ start: () async throws -> Started) async throws -> Started {
        var attempt = 1
        while true {
            do {
                return try await start()
            } catch let error as PortTaken where attempt < 3 {
                logger.warning("local postgres port taken before the server bound it; trying another",
                               metadata: ["db.port": .int(error.port), "attempt": .int(attempt)])
                attempt += 1
            } catch let error as PortTaken {
                throw error.underlying
            }
        }
    }

    /// The server found its port taken (`start` and `startStandby` then try a fresh one).
    package struct PortTaken: Error {
        package var port: Int
        package var underlying: any Error

        package init(port: Int, underlying: any Error) {
            self.port = port
            self.underlying = underlying
        }
    }

    private static func startOnce(logger: Logger, options: Options) async throws -> LocalPostgresCluster {
        let began = ContinuousClock.now
        let binDirectory = try await findBinDirectory()
        let user = try serverUser()
        let directory = try makeDirectory(owner: user)
        let cluster = LocalPostgresCluster(
            binDirectory: binDirectory, directory: directory, port: try freePort(), user: user, options: options,
            logger: logger)
        do {
            try await cluster.initialize()
            try await cluster.startAgain()
            if options.database != "postgres" {
                // Over the socket: with a password, TCP would ask for it.
                try await cluster.client(
                    "createdb", ["-h", directory, "-p", String(cluster.port), "-U", "postgres", options.database])
            }
        } catch {
            let serverLog = readFile(cluster.logPath) ?? ""
            await cluster.destroy()
            if serverLog.contains("Address already in use") { throw PortTaken(port: cluster.port, underlying: error) }
            throw error
        }
        logger.info(
            "local postgres started",
            metadata: [
                "db.port": .int(cluster.port), "db.directory": .string(directory),
                "duration_ms": .int(Int((ContinuousClock.now - began) / .milliseconds(1))),
            ])
        return cluster
    }

    /// Starts the server again on the same data directory and port (after `stop()`).
    package func startAgain() async throws {
        try await server(
            "pg_ctl",
            ["-D", dataDirectory, "-l", logPath, "-w", "-t", String(timeoutSeconds), "start"],
            failure: "the PostgreSQL server did not start")
        state.withLock { $0.running = true }
        logger.debug("local postgres running", metadata: ["db.port": .int(port)])
    }

    /// How `stop(mode:)` ends the server (`pg_ctl stop -m`).
    package enum StopMode: String, Sendable {
        /// Disconnects clients, checkpoints and shuts down (restart tests).
        case fast
        /// Kills every server process at once, as a crash or a lost machine would (failover tests).
        case immediate
    }

    /// `pg_ctl stop`, `fast` unless told otherwise.
    package func stop(mode: StopMode = .fast) async throws {
        try await server(
            "pg_ctl", ["-D", dataDirectory, "-m", mode.rawValue, "-w", "-t", String(timeoutSeconds), "stop"],
            failure: "the PostgreSQL server did not stop")
        state.withLock { $0.running = false }
        logger.debug("local postgres stopped", metadata: ["db.port": .int(port), "db.stop_mode": .string(mode.rawValue)])
    }

    package func restart() async throws {
        try await stop()
        try await startAgain()
    }

    /// Stops the server (fast) and deletes the directory. Never throws; idempotent.
    package func destroy() async {
        guard markDestroyed() else { return }
        if isRunning {
            _ = try? await HelperProgram(
                executable: binDirectory + "/pg_ctl",
                arguments: ["-D", dataDirectory, "-m", "immediate", "-w", "-t", "30", "stop"], user: user,
                directory: directory
            ).run(timeout: .seconds(40))
        }
        removeDirectory()
    }

    /// `destroy()` for `atexit` handlers and deinit.
    package func destroyBlocking() {
        guard markDestroyed() else { return }
        if isRunning {
            _ = try? HelperProgram(
                executable: binDirectory + "/pg_ctl",
                arguments: ["-D", dataDirectory, "-m", "immediate", "-w", "-t", "30", "stop"], user: user,
                directory: directory
            ).runBlocking(timeout: .seconds(40))
        }
        removeDirectory()
    }

    // MARK: Steps

    var timeoutSeconds: Int { max(1, Int(options.timeout / .seconds(1))) }

    private func initialize() async throws {
        var authentication = ["-A", "trust"]
        let passwordFile = directory + "/initdb-password"
        if let password = options.password {
            // The file is the server user's (0600) and gone once initdb has read it.
            try writePrivateFile(passwordFile, password)
            authentication = ["--auth-local=trust", "--auth-host=scram-sha-256", "--pwfile=" + passwordFile]
        }
        defer { unlink(passwordFile) }
        try await server(
            "initdb",
            ["-D", dataDirectory] + authentication + ["-U", "postgres", "--no-sync", "-E", "UTF8", "--locale=C",
             "--no-instructions"],
            failure: "initdb failed")
        var settings: [(String, String)] = [
            ("listen_addresses", "127.0.0.1"), ("port", String(port)), ("unix_socket_directories", directory),
            ("max_connections", String(options.maxConnections)), ("shared_buffers", options.sharedBuffers),
            ("fsync", options.fsync ? "on" : "off"), ("synchronous_commit", options.fsync ? "on" : "off"),
            ("full_page_writes", options.fsync ? "on" : "off"), ("logging_collector", "off"),
        ]
        settings += options.settings.sorted { $0.key < $1.key }
        try appendSettings(settings)
    }

    /// Writes `text` to a new file only the server user can read.
    private func writePrivateFile(_ path: String, _ text: String) throws {
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw LocalPostgresError("cannot create \(path): errno \(errno)") }
        defer { close(fd) }
        let bytes = Array(text.utf8)
        guard write(fd, bytes, bytes.count) == bytes.count else { throw LocalPostgresError("cannot write \(path): errno \(errno)") }
        if let user, let account = getpwnam(user) { fchown(fd, account.pointee.pw_uid, account.pointee.pw_gid) }
    }

    /// Appends to `postgresql.conf`; a later line for the same name wins.
    func appendSettings(_ settings: [(String, String)]) throws {
        var text = "\n# siwa LocalPostgresCluster\n"
        for (name, value) in settings {
            text += "\(name) = '\(value.replacing("'", with: "''"))'\n"
        }
        // Appending as root keeps the file's owner (postgres).
        guard let file = fopen(dataDirectory + "/postgresql.conf", "a") else {
            throw LocalPostgresError("cannot open postgresql.conf: errno \(errno)")
        }
        fputs(text, file)
        fclose(file)
    }

    /// Runs a server program (as the server user when we are root).
    func server(_ program: String, _ arguments: [String], failure: String) async throws {
        let process = HelperProgram(
            executable: binDirectory + "/" + program, arguments: arguments, user: user, directory: directory)
        let outcome = try await process.run(timeout: options.timeout + .seconds(10))
        guard outcome.exitCode == 0 else {
            let log = readFile(logPath) ?? ""
            throw LocalPostgresError(
                "\(failure) (\(program) exit code \(outcome.exitCode))", output: outcome.output + "\n" + log)
        }
    }

    /// Runs a client program as the current user; returns its output.
    @discardableResult
    func client(_ program: String, _ arguments: [String]) async throws -> String {
        let outcome = try await HelperProgram(executable: binDirectory + "/" + program, arguments: arguments)
            .run(timeout: .seconds(30))
        guard outcome.exitCode == 0 else {
            throw LocalPostgresError("\(program) failed (exit code \(outcome.exitCode))", output: outcome.output)
        }
        return outcome.output
    }

    private func markDestroyed() -> Bool {
        state.withLock { state in
            if state.destroyed { return false }
            state.destroyed = true
            return true
        }
    }

    private func removeDirectory() {
        _ = try? HelperProgram(executable: "/bin/rm", arguments: ["-rf", directory]).runBlocking(timeout: .seconds(30))
        state.withLock { $0.running = false }
        OrphanReaper.shared?.forget(clusterIn: directory)
    }
}
