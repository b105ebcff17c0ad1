import Testing
import Webhooks

/// What the sender reports of an attempt: the metric's reason label and the error text recorded on
/// the job. Whether it delivered or is retried is siwa.webhook_retry's (WebhookRetryTableTests).
@Suite("Webhook attempt result")
struct WebhookAttemptResultTests {
    @Test func reasonsAndErrorTexts() {
        #expect(WebhookAttemptResult.answered(status: 204, bodyPrefix: "").failureReason == nil)
        #expect(WebhookAttemptResult.answered(status: 302, bodyPrefix: "").failureReason == "redirect")
        #expect(WebhookAttemptResult.answered(status: 302, bodyPrefix: "").errorText.contains("not followed"))
        #expect(WebhookAttemptResult.answered(status: 404, bodyPrefix: "").failureReason == "client_error")
        #expect(WebhookAttemptResult.answered(status: 500, bodyPrefix: "secret-ish body").errorText == "answered 500")
        #expect(WebhookAttemptResult.timedOut.failureReason == "timeout")
        #expect(WebhookAttemptResult.connectionFailed(detail: "URLError -1004").failureReason == "connection")
    }
}
