import Foundation
import Testing
import Webhooks
import Settings

@Suite("Webhook signatures and settings")
struct WebhookSignatureTests {
    /// The test vector the Standard Webhooks repository publishes for its reference libraries.
    @Test func publishedStandardWebhooksVector() throws {
        let secret = try WebhookSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
        let signature = WebhookSignature.sign(
            id: "msg_p5jXN8AQM9LWM0D4loKWxJek", timestamp: 1_614_265_330, body: Array(#"{"test": 2432232314}"#.utf8),
            secret: secret)
        #expect(signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
    }

    @Test func everySignedPartMatters() throws {
        let secret = try WebhookSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
        let body = Array(#"{"test": 2432232314}"#.utf8)
        let reference = WebhookSignature.sign(id: "msg_1", timestamp: 1_614_265_330, body: body, secret: secret)
        #expect(WebhookSignature.sign(id: "msg_2", timestamp: 1_614_265_330, body: body, secret: secret) != reference)
        #expect(WebhookSignature.sign(id: "msg_1", timestamp: 1_614_265_331, body: body, secret: secret) != reference)
        #expect(WebhookSignature.sign(id: "msg_1", timestamp: 1_614_265_330, body: body + [0x20], secret: secret) != reference)
        let other = try WebhookSecret("whsec_" + Data(repeating: 7, count: 32).base64EncodedString())
        #expect(WebhookSignature.sign(id: "msg_1", timestamp: 1_614_265_330, body: body, secret: other) != reference)
        let headers = WebhookSignature.headers(id: "msg_1", timestamp: 1_614_265_330, body: body, secret: secret)
        #expect(headers.map(\.0) == ["webhook-id", "webhook-timestamp", "webhook-signature"])
        #expect(headers[1].1 == "1614265330")
        #expect(headers[2].1 == reference)
    }

    @Test func secretMustBeWhsecBase64Of24To64Bytes() throws {
        func secret(_ count: Int) -> String { "whsec_" + Data(repeating: 1, count: count).base64EncodedString() }
        #expect(try WebhookSecret(secret(24)).key.count == 24)
        #expect(try WebhookSecret(secret(64)).key.count == 64)
        for bad in [secret(23), secret(65), Data(repeating: 1, count: 32).base64EncodedString(), "whsec_not base64!", "whsec_"] {
            #expect(throws: ConfigurationError.self) { try WebhookSecret(bad) }
        }
        // Never printed.
        let value = try WebhookSecret(secret(32))
        #expect("\(value)" == "whsec_<redacted>")
        do {
            _ = try WebhookSecret("whsec_c2VjcmV0")
            Issue.record("a 6-byte secret was accepted")
        } catch {
            #expect(!"\(error)".contains("c2VjcmV0"))
        }
    }

    private func settings(_ environment: [String: String]) throws -> WebhookSettings? {
        try WebhookSettings.parse(ConfigurationSource(arguments: [], environment: environment))
    }

    private static let secret = "whsec_" + Data(repeating: 9, count: 32).base64EncodedString()

    @Test func urlMustBeHTTPSOrLoopbackHTTP() throws {
        for good in [
            "https://app.example.com/hooks/siwa?token=abc", "http://127.0.0.1:8080/hook", "http://localhost/hook",
            "http://[::1]:9000/", "http://127.1.2.3/x",
        ] {
            let parsed = try settings(["SIWA_WEBHOOK_URL": good, "SIWA_WEBHOOK_SECRET": Self.secret])
            #expect(parsed?.url.absoluteString == good)
        }
        for bad in [
            "http://app.example.com/hook", "http://10.0.0.1/hook", "http://128.0.0.1/", "ftp://example.com/",
            "https://user:pass@example.com/", "https://example.com/#frag", "/relative/path", "https://",
        ] {
            #expect(throws: ConfigurationError.self, "\(bad)") {
                try settings(["SIWA_WEBHOOK_URL": bad, "SIWA_WEBHOOK_SECRET": Self.secret])
            }
        }
    }

    @Test func bothVariablesOrNeither() throws {
        #expect(try settings([:]) == nil)
        let missingSecret = #expect(throws: ConfigurationError.self) {
            try settings(["SIWA_WEBHOOK_URL": "https://example.com/hook"])
        }
        #expect(missingSecret?.variable == "SIWA_WEBHOOK_SECRET")
        let missingURL = #expect(throws: ConfigurationError.self) { try settings(["SIWA_WEBHOOK_SECRET": Self.secret]) }
        #expect(missingURL?.variable == "SIWA_WEBHOOK_SECRET")
        let parsed = try settings(["SIWA_WEBHOOK_URL": "https://example.com/a/b?token=t", "SIWA_WEBHOOK_SECRET": Self.secret])
        #expect(parsed?.timeout == .seconds(10))
        #expect(parsed?.retryWindow == .seconds(86_400))
        #expect(parsed?.endpoint == "https://example.com/a/b")  // the query (a possible token) is never shown
    }
}
