package import Foundation
#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// What one delivery attempt got. Only a 2xx is delivered; a redirect is an answer we do not
/// follow (the endpoint must be configured as it is), so it counts as a failure like a 5xx.
package enum WebhookAttemptResult: Sendable, Equatable {
    case answered(status: Int, bodyPrefix: String)
    /// No answer within the timeout.
    case timedOut
    /// No HTTP answer at all (refused, reset, DNS, TLS): the detail names the error code, never data.
    case connectionFailed(detail: String)

    package var delivered: Bool {
        if case .answered(let status, _) = self { return (200...299).contains(status) }
        return false
    }

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

/// POSTs signed deliveries, keeping connections to the endpoint alive across deliveries; every
/// request is bounded by the timeout; redirects are never followed. An `http://` loopback endpoint
/// is spoken to directly (LoopbackHTTPTransport: URLSession's per-request cost on Linux was most of
/// a delivery's CPU); `https://` goes through one URLSession (libcurl underneath).
package final class WebhookClient: Sendable {
    /// How requests are sent: `automatic` picks the direct transport for `http://` loopback
    /// endpoints; `urlSession` always uses URLSession (tests check both give the same results).
    package enum Transport: Sendable {
        case automatic
        case urlSession
    }

    private let session: URLSession
    private let loopback: LoopbackHTTPTransport?
    private let url: URL
    private let timeout: Duration

    package init(url: URL, timeout: Duration, maxConnections: Int, transport: Transport = .automatic) {
        self.url = url
        self.timeout = timeout
        loopback = transport == .automatic ? LoopbackHTTPTransport(url: url, timeout: timeout) : nil
        let configuration = URLSessionConfiguration.ephemeral
        let seconds = Double(timeout.components.seconds) + Double(timeout.components.attoseconds) / 1e18
        configuration.timeoutIntervalForRequest = seconds
        configuration.timeoutIntervalForResource = seconds
        configuration.httpMaximumConnectionsPerHost = maxConnections
        configuration.requestCachePolicy = .reloadIgnoringLocalCacheData
        configuration.urlCache = nil
        configuration.httpCookieStorage = nil
        configuration.httpShouldSetCookies = false
        session = URLSession(configuration: configuration, delegate: RefuseRedirects(), delegateQueue: nil)
    }

    deinit { session.invalidateAndCancel() }

    /// One attempt: `POST` the body with the Standard Webhooks headers.
    package func send(body: [UInt8], headers: [(String, String)]) async -> WebhookAttemptResult {
        if let loopback { return await loopback.send(body: body, headers: headers) }
        var request = URLRequest(url: url)
        request.httpMethod = "POST"
        request.httpBody = Data(body)
        request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        request.setValue("siwa-notifications-webhooks", forHTTPHeaderField: "User-Agent")
        for (name, value) in headers { request.setValue(value, forHTTPHeaderField: name) }
        do {
            let (data, response) = try await session.data(for: request)
            guard let http = response as? HTTPURLResponse else { return .connectionFailed(detail: "no HTTP response") }
            return .answered(status: http.statusCode, bodyPrefix: String(decoding: data.prefix(512), as: UTF8.self))
        } catch let error as URLError {
            if error.code == .timedOut { return .timedOut }
            return .connectionFailed(detail: "URLError \(error.code.rawValue)")
        } catch {
            return .connectionFailed(detail: String(describing: type(of: error)))
        }
    }
}

/// A 3xx is handed back as the answer instead of being followed.
private final class RefuseRedirects: NSObject, URLSessionTaskDelegate, Sendable {
    func urlSession(
        _ session: URLSession, task: URLSessionTask, willPerformHTTPRedirection response: HTTPURLResponse,
        newRequest request: URLRequest, completionHandler: @escaping @Sendable (URLRequest?) -> Void
    ) {
        completionHandler(nil)
    }
}
