import ReceiverCore
import SiwaCore
import Testing

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
        #expect(try Self.configuration([:]).commitTimeout == .seconds(5))
        #expect(try Self.configuration(["SIWA_RECEIVER_COMMIT_TIMEOUT": "250ms"]).commitTimeout == .milliseconds(250))
    }
}
