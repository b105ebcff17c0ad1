import Testing
import WorkerCore
import AppAPI
import Settings

/// `SIWA_APP_API_LISTEN`, `SIWA_APP_API_TOKENS`, `SIWA_NONCE_TTL` as the worker reads them.
@Suite struct AppAPIConfigurationTests {
    static let base = [
        "DATABASE_URL": "postgresql://localhost/siwa", "SIWA_CLIENT_IDS": "com.example.app", "SIWA_APPLE_CALLS": "disabled",
    ]

    func configuration(_ extra: [String: String]) throws(ConfigurationError) -> AppAPIConfiguration? {
        try AppAPIConfiguration(ConfigurationSource(arguments: [], environment: Self.base.merging(extra) { $1 }))
    }

    @Test func unsetMeansNotServed() throws {
        #expect(try configuration([:]) == nil)
        #expect(try WorkerConfiguration(ConfigurationSource(arguments: [], environment: Self.base)).appAPI == nil)
    }

    @Test func tokensAndLifetime() throws {
        let token = String(repeating: "t", count: 32)
        let parsed = try #require(try configuration([
            "SIWA_APP_API_LISTEN": "127.0.0.1:8081", "SIWA_APP_API_TOKENS": "\(token), \(token)x", "SIWA_NONCE_TTL": "90s",
        ]))
        #expect(parsed.listen == ListenAddress(host: "127.0.0.1", port: 8081))
        #expect(parsed.tokens == [token, token + "x"] && parsed.nonceLifetime == .seconds(90))
        #expect(try configuration(["SIWA_APP_API_LISTEN": "127.0.0.1:8081", "SIWA_APP_API_TOKENS": token])?.nonceLifetime == .seconds(300))
    }

    @Test func badValuesNameTheVariableAndNeverTheToken() {
        let short = "short-secret-token"
        let cases: [([String: String], String)] = [
            (["SIWA_APP_API_LISTEN": "127.0.0.1:8081"], "SIWA_APP_API_TOKENS"),
            (["SIWA_APP_API_LISTEN": "127.0.0.1:8081", "SIWA_APP_API_TOKENS": short], "SIWA_APP_API_TOKENS"),
            (["SIWA_APP_API_LISTEN": "nowhere", "SIWA_APP_API_TOKENS": String(repeating: "t", count: 32)], "SIWA_APP_API_LISTEN"),
            (["SIWA_APP_API_LISTEN": "127.0.0.1:8081", "SIWA_APP_API_TOKENS": String(repeating: "t", count: 32),
              "SIWA_NONCE_TTL": "1s"], "SIWA_NONCE_TTL"),
        ]
        for (environment, variable) in cases {
            #expect {
                _ = try configuration(environment)
            } throws: { error in
                guard let error = error as? ConfigurationError else { return false }
                return error.variable == variable && !error.description.contains(short)
            }
        }
    }

    @Test func theWorkerServesItOnlyWithAppleCalls() {
        let environment = Self.base.merging([
            "SIWA_APP_API_LISTEN": "127.0.0.1:8081", "SIWA_APP_API_TOKENS": String(repeating: "t", count: 32),
        ]) { $1 }
        #expect {
            _ = try WorkerConfiguration(ConfigurationSource(arguments: [], environment: environment))
        } throws: { ($0 as? ConfigurationError)?.variable == "SIWA_APP_API_LISTEN" }
    }
}
