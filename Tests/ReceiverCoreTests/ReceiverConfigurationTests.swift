import ReceiverCore
import Testing
import Settings

@Suite struct ReceiverConfigurationTests {
    static func configuration(_ extra: [String: String]) throws -> ReceiverConfiguration {
        try ReceiverConfiguration(
            ConfigurationSource(
                arguments: [],
                environment: ["DATABASE_URL": "postgresql://x@127.0.0.1/x", "SIWA_CLIENT_IDS": "com.example.app"]
                    .merging(extra) { _, new in new }))
    }

    /// Reachable from anywhere: one address may hold 64 connections. On loopback only, the proxy in
    /// front is every connection's address, so only an explicit value applies.
    @Test func perAddressLimitDependsOnWhereItListens() throws {
        #expect(try Self.configuration([:]).perAddressLimit == 64)
        #expect(try Self.configuration(["SIWA_LISTEN": "127.0.0.1:8080"]).perAddressLimit == nil)
        #expect(try Self.configuration(["SIWA_LISTEN": "127.0.0.1:8080", "SIWA_RECEIVER_PER_ADDRESS_LIMIT": "4"]).perAddressLimit == 4)
        #expect(try Self.configuration(["SIWA_RECEIVER_CONNECTION_LIMIT": "10"]).perAddressLimit == 10)
    }

    /// The waits the contract and README bound: a commit 5 s, a whole request 30 s. A value outside
    /// the range is refused at start, not clamped into something the operator did not ask for.
    @Test func timeoutsHaveTheirDocumentedDefaultsAndRanges() throws {
        let defaults = try Self.configuration([:])
        #expect(defaults.commitTimeout == .seconds(5))
        #expect(defaults.requestTimeout == .seconds(30))
        let set = try Self.configuration(["SIWA_RECEIVER_COMMIT_TIMEOUT": "250ms", "SIWA_RECEIVER_REQUEST_TIMEOUT": "2s"])
        #expect(set.commitTimeout == .milliseconds(250))
        #expect(set.requestTimeout == .seconds(2))
        #expect(throws: ConfigurationError.self) { try Self.configuration(["SIWA_RECEIVER_COMMIT_TIMEOUT": "10ms"]) }
        #expect(throws: ConfigurationError.self) { try Self.configuration(["SIWA_RECEIVER_REQUEST_TIMEOUT": "2h"]) }
        #expect(throws: ConfigurationError.self) { try Self.configuration(["SIWA_RECEIVER_COMMIT_TIMEOUT": "soon"]) }
    }
}
