import Postgres
import Testing
import WorkerCore
import Settings

@Suite struct WorkerConfigurationTests {
    static func configuration(_ extra: [String: String]) throws -> WorkerConfiguration {
        try WorkerConfiguration(
            ConfigurationSource(
                arguments: [],
                environment: ["DATABASE_URL": "postgresql://x@127.0.0.1/x", "SIWA_CLIENT_IDS": "com.example.app",
                              "SIWA_APPLE_CALLS": "disabled"]
                    .merging(extra) { _, new in new }))
    }

    /// Every worker statement is bounded (60 s unless set), and a lock wait gives up at half of it so
    /// the log names the lock rather than a timeout. Out of range is refused at start.
    @Test func statementsAreBoundedByDefault() throws {
        let defaults = try Self.configuration([:]).sessionLimits
        #expect(defaults.statementTimeout == .seconds(60))
        #expect(defaults.lockTimeout == .seconds(30))
        let set = try Self.configuration(["SIWA_WORKER_STATEMENT_TIMEOUT": "4s"]).sessionLimits
        #expect(set.statementTimeout == .seconds(4))
        #expect(set.lockTimeout == .seconds(2))
        #expect(throws: ConfigurationError.self) { try Self.configuration(["SIWA_WORKER_STATEMENT_TIMEOUT": "0s"]) }
        #expect(throws: ConfigurationError.self) { try Self.configuration(["SIWA_WORKER_STATEMENT_TIMEOUT": "2h"]) }
    }
}
