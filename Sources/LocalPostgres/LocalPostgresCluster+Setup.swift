import ChildProcesses

#if canImport(Glibc)
    internal import Glibc
#elseif canImport(Darwin)
    internal import Darwin
#endif

extension LocalPostgresCluster {
    static let installHint = "install PostgreSQL with `apt-get update && apt-get install -y postgresql`"

    /// `$PG_BINDIR`, else `pg_config --bindir` (if initdb is there: libpq-dev's pg_config names the
    /// folder even without the server), else the newest `/usr/lib/postgresql/*/bin`.
    static func findBinDirectory() async throws -> String {
        func hasServer(_ directory: String) -> Bool {
            access(directory + "/initdb", X_OK) == 0 && access(directory + "/pg_ctl", X_OK) == 0
        }
        if let override = getenv("PG_BINDIR").map({ String(cString: $0) }), !override.isEmpty {
            guard hasServer(override) else {
                throw LocalPostgresError("PG_BINDIR=\(override) has no initdb/pg_ctl; \(installHint)")
            }
            return override
        }
        if let outcome = try? await HelperProgram(executable: "/usr/bin/env", arguments: ["pg_config", "--bindir"])
            .run(timeout: .seconds(10)), outcome.exitCode == 0
        {
            let directory = outcome.output.split(separator: "\n").first.map(String.init) ?? ""
            if hasServer(directory) { return directory }
        }
        var versions: [(Int, String)] = []
        if let folder = opendir("/usr/lib/postgresql") {
            defer { closedir(folder) }
            while let entry = readdir(folder) {
                let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                    String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
                }
                if let version = Int(name), hasServer("/usr/lib/postgresql/\(name)/bin") {
                    versions.append((version, "/usr/lib/postgresql/\(name)/bin"))
                }
            }
        }
        if let newest = versions.max(by: { $0.0 < $1.0 }) { return newest.1 }
        throw LocalPostgresError("PostgreSQL server programs (initdb, pg_ctl) not found; \(installHint)")
    }

    /// initdb and postgres refuse to run as root: then use the `postgres` system user.
    static func serverUser() throws -> String? {
        guard geteuid() == 0 else { return nil }
        guard getpwnam("postgres") != nil else {
            throw LocalPostgresError(
                "running as root, but there is no `postgres` user to run the server as; \(installHint)")
        }
        return "postgres"
    }

    /// A fresh `$TMPDIR/siwa-pg-XXXXXX` (default `/tmp`), mode 0700, owned by the server user.
    static func makeDirectory(owner: String?) throws -> String {
        var template = Array((temporaryFolder() + "/siwa-pg-XXXXXX").utf8CString)
        guard mkdtemp(&template) != nil else { throw LocalPostgresError("mkdtemp failed: errno \(errno)") }
        let directory = stringFromCArray(template)
        chmod(directory, 0o700)
        if let owner, let account = getpwnam(owner) {
            guard chown(directory, account.pointee.pw_uid, account.pointee.pw_gid) == 0 else {
                rmdir(directory)
                throw LocalPostgresError("chown \(directory) to \(owner) failed: errno \(errno)")
            }
        }
        return directory
    }

    /// Binds port 0 on 127.0.0.1, reads the port the kernel chose, closes the socket. The one place
    /// a port is chosen before its server binds it: PostgreSQL cannot be told port 0 (`port` must be
    /// 1-65535, and it reports no port it did not configure), so the port is free when chosen but not
    /// reserved; `start` retries on a fresh port when the server finds it taken.
    static func freePort() throws -> Int {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard descriptor >= 0 else { throw LocalPostgresError("socket failed: errno \(errno)") }
        defer { close(descriptor) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = 0
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { socketAddress in
                bind(descriptor, socketAddress, length) == 0
                    && getsockname(descriptor, socketAddress, &length) == 0
            }
        }
        guard bound else { throw LocalPostgresError("could not find a free port: errno \(errno)") }
        return Int(UInt16(bigEndian: address.sin_port))
    }
}
