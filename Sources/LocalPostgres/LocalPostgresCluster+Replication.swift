import Logging

/// A primary and a streaming standby on 127.0.0.1, for failover tests: `pg_basebackup -R` makes the
/// standby, `requireSynchronousStandby` makes every commit wait for it, `stop(mode: .immediate)` and
/// `promote()` play the failover.
extension LocalPostgresCluster {
    /// A hot standby streaming from this (running) cluster: `pg_basebackup -R` into a fresh directory,
    /// its own free port, started and accepting read-only connections. `name` is its `cluster_name`,
    /// which it reports to the primary as `application_name` (what `synchronous_standby_names` lists).
    package func startStandby(name: String = "standby") async throws -> LocalPostgresCluster {
        // Its port is chosen before the server binds it, as `start`'s is: a port taken meanwhile
        // costs a fresh standby on a fresh port, a bounded number of times.
        try await Self.onFreshPorts(logger: logger) { try await startStandbyOnce(name: name) }
    }

    private func startStandbyOnce(name: String) async throws -> LocalPostgresCluster {
        let directory = try Self.makeDirectory(owner: user)
        let standby = LocalPostgresCluster(
            binDirectory: binDirectory, directory: directory, port: try Self.freePort(), user: user, options: options,
            logger: logger)
        do {
            try await standby.server(
                "pg_basebackup",
                ["-h", "127.0.0.1", "-p", String(port), "-U", "postgres", "-D", standby.dataDirectory, "-R",
                 "-X", "stream", "-c", "fast", "--no-sync"],
                failure: "pg_basebackup failed")
            // The copy carries the primary's settings; later lines win. A standby lists no synchronous
            // standby of its own: once promoted, its commits must not wait for one that does not exist.
            try standby.appendSettings([
                ("port", String(standby.port)), ("unix_socket_directories", directory), ("cluster_name", name),
                ("synchronous_standby_names", ""),
            ])
            try await standby.startAgain()
        } catch {
            let serverLog = readFile(standby.logPath) ?? ""
            await standby.destroy()
            if serverLog.contains("Address already in use") { throw PortTaken(port: standby.port, underlying: error) }
            throw error
        }
        logger.info("local postgres standby started", metadata: ["db.port": .int(standby.port), "db.primary_port": .int(port)])
        return standby
    }

    /// Makes this primary's commits wait until `standbyName` has flushed them
    /// (`synchronous_standby_names`, through `ALTER SYSTEM` so the standby's copy of the settings
    /// stays without it), then waits until that standby is attached as `sync`.
    package func requireSynchronousStandby(_ standbyName: String, timeout: Duration = .seconds(30)) async throws {
        let quoted = standbyName.replacing("\"", with: "\"\"").replacing("'", with: "''")
        try await psql("ALTER SYSTEM SET synchronous_standby_names = '\"\(quoted)\"'", "SELECT pg_reload_conf()")
        let deadline = ContinuousClock.now + timeout
        let check =
            "SELECT count(*) FROM pg_stat_replication WHERE application_name = '\(standbyName.replacing("'", with: "''"))' AND sync_state = 'sync'"
        while try await psql(check).trimmingPrefix(while: \.isWhitespace).hasPrefix("0") {
            guard ContinuousClock.now < deadline else {
                throw LocalPostgresError("standby \(standbyName) did not become synchronous within \(timeout)")
            }
            try await Task.sleep(for: .milliseconds(50))
        }
    }

    /// `pg_ctl promote -w`: the standby ends recovery and accepts writes when this returns.
    package func promote() async throws {
        try await server(
            "pg_ctl", ["-D", dataDirectory, "-w", "-t", String(timeoutSeconds), "promote"],
            failure: "the standby was not promoted")
        logger.info("local postgres promoted", metadata: ["db.port": .int(port)])
    }

    /// Runs each statement with `psql -c` (one transaction each) as `postgres` in database `postgres`;
    /// returns the unaligned, tuples-only output.
    @discardableResult
    package func psql(_ statements: String...) async throws -> String {
        var arguments = ["-h", "127.0.0.1", "-p", String(port), "-U", "postgres", "-d", "postgres", "-X", "-A", "-t",
                         "-v", "ON_ERROR_STOP=1"]
        for statement in statements { arguments += ["-c", statement] }
        return try await client("psql", arguments)
    }

    /// A libpq multi-host URL over `clusters` that connects only to the one accepting writes:
    /// `postgresql://postgres@127.0.0.1:P1,127.0.0.1:P2/DB?target_session_attrs=read-write`.
    package static func multiHostURL(_ clusters: [LocalPostgresCluster], database: String? = nil) -> String {
        let hosts = clusters.map { "127.0.0.1:\($0.port)" }.joined(separator: ",")
        let name = database ?? clusters.first?.database ?? "postgres"
        return "postgresql://postgres@\(hosts)/\(name)?target_session_attrs=read-write"
    }
}
