package import Foundation
import OutboundHTTP

/// What one delivery attempt got, as reported to siwa.finish_webhook_deliveries (which decides that
/// only a 2xx is delivered). A redirect is an answer we do not follow (the endpoint must be
/// configured as it is), so it counts as a failure like a 5xx.
package enum WebhookAttemptResult: Sendable, Equatable {
    case answered(status: Int, bodyPrefix: String)
    /// No answer within the timeout.
    case timedOut
    /// No HTTP answer at all (refused, reset, DNS, TLS): the detail names the error code, never data.
    case connectionFailed(detail: String)

    /// The `reason` label of `siwa_webhook_failures_total`: a small closed set.
    package var failureReason: String? {
        switch self {
        case .answered(let status, _):
            switch status {
            case 200...299: return nil
            case 300...399: return "redirect"
            case 400...499: return "client_error"
            case 500...599: return "server_error"
            default: return "other_status"
            }
        case .timedOut: return "timeout"
        case .connectionFailed: return "connection"
        }
    }

    /// The error recorded on the job (no response body: it is the receiver's, of any size or content).
    package var errorText: String {
        switch self {
        case .answered(let status, _) where (300...399).contains(status):
            "answered \(status) (redirects are not followed: set SIWA_WEBHOOK_URL to the final URL)"
        case .answered(let status, _): "answered \(status)"
        case .timedOut: "no answer within the timeout"
        case .connectionFailed(let detail): "connection failed: \(detail)"
        }
    }
}

/// POSTs signed deliveries over the process's one HTTP client (keep-alive connections reused
/// across deliveries, HTTP/2 when the endpoint offers it); every request is bounded by the
/// timeout; redirects are never followed. Of an answer's body only the first 512 bytes are kept.
package final class WebhookClient: Sendable {
    /// The most of an answer's body a delivery records.
    static let keptBodyBytes = 512

    private let client: HTTPClient
    private let url: URL
    private let timeout: Duration

    package init(url: URL, timeout: Duration, caCertificates: String? = nil) {
        self.url = url
        self.timeout = timeout
        client = HTTPClient(extraCertificatesPEM: caCertificates)
    }

    /// One attempt: `POST` the body with the Standard Webhooks headers. An answer whose head came
    /// whole counts as its status says, whatever follows (a body too large, cut short or broken):
    /// the endpoint has answered. One whose head never ended is a failed attempt.
    package func send(body: [UInt8], headers: [(String, String)]) async -> WebhookAttemptResult {
        let request = HTTPRequest(
            method: "POST", url: url.absoluteString,
            headers: [("Content-Type", "application/json"), ("User-Agent", "siwa-notifications-webhooks")] + headers, body: body,
            timeout: timeout, bodyLimit: .prefix(Self.keptBodyBytes))
        do {
            let response = try await client.send(request)
            return .answered(status: response.status, bodyPrefix: String(decoding: response.body, as: UTF8.self))
        } catch {
            if let status = error.status { return .answered(status: status, bodyPrefix: "") }
            if error.kind == .timeout { return .timedOut }
            return .connectionFailed(detail: error.description)
        }
    }
}
