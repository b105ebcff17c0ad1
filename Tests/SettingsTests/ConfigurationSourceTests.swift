import Foundation
import Testing
import Settings
import Metrics

@Suite struct ConfigurationSourceTests {
    @Test func flagWinsOverEnvironment() throws {
        let source = try ConfigurationSource(
            arguments: ["--siwa-listen", "127.0.0.1:9", "--database-url=postgres://x"],
            environment: ["SIWA_LISTEN": "0.0.0.0:80", "DATABASE_URL": "postgres://env"])
        #expect(try source.string("SIWA_LISTEN") == "127.0.0.1:9")
        #expect(try source.string("DATABASE_URL") == "postgres://x")
    }

    @Test func fileVariantIsReadAndTrimmed() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("siwa-cfg-\(UUID())").path
        try "postgres://from-file\n".write(toFile: path, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: path) }
        let source = try ConfigurationSource(arguments: [], environment: ["DATABASE_URL_FILE": path])
        #expect(try source.string("DATABASE_URL") == "postgres://from-file")
    }

    @Test func unreadableFileNamesTheVariable() throws {
        let source = try ConfigurationSource(arguments: [], environment: ["DATABASE_URL_FILE": "/nonexistent/x"])
        #expect(throws: ConfigurationError(variable: "DATABASE_URL_FILE", problem: "cannot read /nonexistent/x")) {
            try source.string("DATABASE_URL")
        }
    }

    @Test func variableAndItsFileTwinTogetherAreRefused() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("siwa-cfg-\(UUID())").path
        try "postgres://from-file\n".write(toFile: path, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: path) }
        let both = try ConfigurationSource(arguments: [], environment: ["DATABASE_URL": "postgres://x", "DATABASE_URL_FILE": path])
        #expect(throws: ConfigurationError(variable: "DATABASE_URL", problem: "is set together with DATABASE_URL_FILE; set one of them")) {
            try both.string("DATABASE_URL")
        }
        // A flag still wins over the environment, whichever form each takes.
        let flagOverFile = try ConfigurationSource(arguments: ["--database-url", "postgres://flag"], environment: ["DATABASE_URL_FILE": path])
        #expect(try flagOverFile.string("DATABASE_URL") == "postgres://flag")
        let fileFlagOverVariable = try ConfigurationSource(arguments: ["--database-url-file", path], environment: ["DATABASE_URL": "postgres://x"])
        #expect(try fileFlagOverVariable.string("DATABASE_URL") == "postgres://from-file")
    }

    @Test func emptyFileIsAnError() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("siwa-cfg-\(UUID())").path
        try "\n".write(toFile: path, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: path) }
        let source = try ConfigurationSource(arguments: [], environment: ["SIWA_TOKEN_KEYS_FILE": path])
        #expect(throws: ConfigurationError(variable: "SIWA_TOKEN_KEYS_FILE", problem: "\(path) is empty")) {
            try source.string("SIWA_TOKEN_KEYS")
        }
    }

    @Test func badIntegerNamesRangeAndValue() throws {
        let source = try ConfigurationSource(arguments: [], environment: ["SIWA_WORKER_CONCURRENCY": "many"])
        do {
            _ = try source.integer("SIWA_WORKER_CONCURRENCY", default: 4, range: 1...256)
            Issue.record("accepted a bad integer")
        } catch {
            #expect(error.variable == "SIWA_WORKER_CONCURRENCY")
            #expect(error.description.contains("\"many\""))
        }
    }

    /// Client secrets and refresh tokens go to SIWA_APPLE_BASE_URL: clear text only on this machine.
    @Test func appleBaseURLTakesHTTPOnlyForLoopback() throws {
        func accepts(_ url: String) -> Bool {
            let source = try? ConfigurationSource(arguments: [], environment: ["SIWA_APPLE_BASE_URL": url])
            return source.flatMap { try? CommonSettings.appleBaseURL($0) } != nil
        }
        for url in ["https://appleid.apple.com", "http://127.0.0.1:9000", "http://127.8.9.10", "http://localhost:1", "http://[::1]:8"] {
            #expect(accepts(url), "\(url)")
        }
        for url in ["http://appleid.apple.com", "http://10.0.0.1:80", "http://127.0.0.1.evil.example", "http://0.0.0.0:1", "ftp://x"] {
            #expect(!accepts(url), "\(url)")
        }
    }

    @Test func durationsParseAndHugeOnesAreRefusedNotTrapped() throws {
        #expect(ConfigurationSource.parseDuration("500ms") == .milliseconds(500))
        #expect(ConfigurationSource.parseDuration("5s") == .seconds(5))
        #expect(ConfigurationSource.parseDuration("2m") == .seconds(120))
        #expect(ConfigurationSource.parseDuration("1.5") == .milliseconds(1500))
        // Counted in Int64 milliseconds, 1e300 seconds trapped the process at start.
        #expect(ConfigurationSource.parseDuration("1e300s") == nil)
        let source = try ConfigurationSource(arguments: [], environment: ["SIWA_RECEIVER_COMMIT_TIMEOUT": "1e300"])
        #expect(throws: ConfigurationError.self) {
            try source.duration("SIWA_RECEIVER_COMMIT_TIMEOUT", default: .seconds(5), range: .milliseconds(100) ... .seconds(600))
        }
    }

    @Test(arguments: ["8080", "host:", ":80", "h:99999", "h:-1"])
    func badListenAddressesAreRejected(text: String) {
        #expect(ListenAddress(text) == nil)
    }

    @Test func listenAddressForms() {
        #expect(ListenAddress("0.0.0.0:8080") == ListenAddress(host: "0.0.0.0", port: 8080))
        #expect(ListenAddress("[::1]:9090") == ListenAddress(host: "::1", port: 9090))
    }

    @Test func missingValueAfterFlagIsAnError() {
        #expect(throws: ConfigurationError.self) { try ConfigurationSource(arguments: ["--siwa-listen"], environment: [:]) }
    }

    @Test func commandFlagsIgnoreTheEnvironment() throws {
        let source = try ConfigurationSource(arguments: ["--sub", "s1"], environment: ["SUB": "leak", "EMAIL": "leak"])
        let flags = source.withoutEnvironment()
        #expect(try flags.string("SUB") == "s1")
        #expect(try flags.string("EMAIL") == nil)
        #expect(try source.string("EMAIL") == "leak", "settings still read the environment")
    }

    @Test func unknownFlagsAreReported() throws {
        let source = try ConfigurationSource(arguments: ["--siwa-lisen", "x"], environment: [:])
        #expect(source.unknownFlags(known: ["SIWA_LISTEN"]) == ["siwa-lisen"])
    }

    /// With the program's flags known, a misspelt flag is named as unknown even when nothing follows
    /// it (not "expects a value"), a switch given a value is refused, and `--flag=value` reads as
    /// `--flag value`.
    @Test func knownFlagsNameTheUnknownOneAndRefuseAValueForASwitch() throws {
        let known: Set<String> = ["state", "database-url"]
        #expect(throws: ConfigurationError(variable: "--jsn", problem: "unknown option")) {
            try ConfigurationSource(arguments: ["--jsn"], environment: [:], booleanFlags: ["json"], knownFlags: known)
        }
        #expect(throws: ConfigurationError(variable: "--stat", problem: "unknown option")) {
            try ConfigurationSource(arguments: ["--stat=x"], environment: [:], booleanFlags: ["json"], knownFlags: known)
        }
        #expect(throws: ConfigurationError(variable: "--json", problem: "takes no value (write --json alone)")) {
            try ConfigurationSource(arguments: ["--json=yes"], environment: [:], booleanFlags: ["json"], knownFlags: known)
        }
        let source = try ConfigurationSource(
            arguments: ["--state=discarded", "--database-url=postgresql://h/d?a=b", "--json", "list"], environment: [:],
            booleanFlags: ["json"], knownFlags: known)
        #expect(source.option("state") == "discarded")
        #expect(try source.string("DATABASE_URL") == "postgresql://h/d?a=b", "only the first = splits")
        #expect(source.isSet(switch: "json") && source.positional == ["list"])
    }

    @Test func databaseURLShapeIsChecked() throws {
        let bad = try ConfigurationSource(arguments: [], environment: ["DATABASE_URL": "mysql-ish"])
        #expect(throws: ConfigurationError.self) { try CommonSettings.databaseURL(bad) }
        let good = try ConfigurationSource(arguments: [], environment: ["DATABASE_URL": "host=/tmp dbname=x"])
        #expect(try CommonSettings.databaseURL(good) == "host=/tmp dbname=x")
        // libpq's multi-host forms pass through unchanged (the failover contract).
        for url in [
            "postgresql://u@db1:5432,db2:5432/siwa?target_session_attrs=read-write",
            "host=db1,db2 port=5432,5432 dbname=siwa target_session_attrs=read-write",
        ] {
            let multiHost = try ConfigurationSource(arguments: [], environment: ["DATABASE_URL": url])
            #expect(try CommonSettings.databaseURL(multiHost) == url)
        }
    }
}

@Suite struct MetricsRegistryTests {
    @Test func rendersCountersAndHistogramsInPrometheusText() {
        let registry = MetricsRegistry()
        let ok = registry.counter("siwa_requests_total", help: "Requests.", labels: ["status": "200"])
        let bad = registry.counter("siwa_requests_total", help: "Requests.", labels: ["status": "401"])
        let latency = registry.histogram("siwa_commit_seconds", help: "Commit.", buckets: [0.01, 0.1])
        ok.increment(by: 3)
        bad.increment()
        latency.observe(0.005)
        latency.observe(0.05)
        latency.observe(5)
        let text = registry.render()
        #expect(text.components(separatedBy: "# TYPE siwa_requests_total counter").count == 2)
        #expect(text.contains("siwa_requests_total{status=\"200\"} 3\n"))
        #expect(text.contains("siwa_requests_total{status=\"401\"} 1\n"))
        #expect(text.contains("siwa_commit_seconds_bucket{le=\"0.01\"} 1\n"))
        #expect(text.contains("siwa_commit_seconds_bucket{le=\"0.1\"} 2\n"))
        #expect(text.contains("siwa_commit_seconds_bucket{le=\"+Inf\"} 3\n"))
        #expect(text.contains("siwa_commit_seconds_count 3\n"))
    }
}
