package import Foundation
#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// What Apple answered: status, body, and the headers we act on (lowercased names).
package struct AppleHTTPResponse: Sendable {
    package var status: Int
    package var body: [UInt8]
    package var headers: [String: String]

    package init(status: Int, body: [UInt8], headers: [String: String] = [:]) {
        self.status = status
        self.body = body
        self.headers = headers
    }

    /// `error` of an OAuth error body (`{"error":"invalid_grant"}`), if there is one.
    package var oauthError: String? {
        guard let object = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any] else { return nil }
        return object["error"] as? String
    }
}

/// A call that got no HTTP answer: it timed out or could not connect. Always worth retrying.
package struct AppleTransportError: Error, CustomStringConvertible {
    package enum Kind: String, Sendable { case timeout, connection }
    package var kind: Kind
    package var endpoint: String
    package var detail: String

    package init(kind: Kind, endpoint: String, detail: String) {
        self.kind = kind
        self.endpoint = endpoint
        self.detail = detail
    }

    package var description: String { "\(endpoint): \(kind.rawValue): \(detail)" }
}

/// The HTTP side of every call to Apple (or to a stand-in at `SIWA_APPLE_BASE_URL`), with a bound
/// on each call so no wait is unbounded. Form bodies may hold secrets: nothing here logs them.
package final class AppleHTTP: Sendable {
    package let baseURL: URL
    private let session: URLSession

    package init(baseURL: URL, timeout: Duration = .seconds(10)) {
        self.baseURL = baseURL
        let configuration = URLSessionConfiguration.ephemeral
        let seconds = Double(timeout.components.seconds) + Double(timeout.components.attoseconds) / 1e18
        configuration.timeoutIntervalForRequest = seconds
        configuration.timeoutIntervalForResource = seconds
        configuration.httpMaximumConnectionsPerHost = 16
        configuration.requestCachePolicy = .reloadIgnoringLocalCacheData
        configuration.urlCache = nil
        session = URLSession(configuration: configuration, delegate: NoRedirects(), delegateQueue: nil)
    }

    package func get(_ path: String) async throws -> AppleHTTPResponse {
        var request = URLRequest(url: baseURL.appendingPathComponent(path))
        request.httpMethod = "GET"
        request.setValue("application/json", forHTTPHeaderField: "Accept")
        return try await send(request, endpoint: path)
    }

    /// `bearer`: an access token for `Authorization` (user migration calls). Secret: never logged.
    package func postForm(_ path: String, fields: [(String, String)], bearer: String? = nil) async throws -> AppleHTTPResponse {
        var request = URLRequest(url: baseURL.appendingPathComponent(path))
        request.httpMethod = "POST"
        if let bearer { request.setValue("Bearer \(bearer)", forHTTPHeaderField: "Authorization") }
        request.setValue("application/x-www-form-urlencoded", forHTTPHeaderField: "Content-Type")
        request.setValue("application/json", forHTTPHeaderField: "Accept")
        request.httpBody = Data(FormEncoding.encode(fields).utf8)
        return try await send(request, endpoint: path)
    }

    private func send(_ request: URLRequest, endpoint: String) async throws -> AppleHTTPResponse {
        do {
            let (data, response) = try await session.data(for: request)
            guard let http = response as? HTTPURLResponse else {
                throw AppleTransportError(kind: .connection, endpoint: endpoint, detail: "no HTTP response")
            }
            var headers: [String: String] = [:]
            for (key, value) in http.allHeaderFields {
                if let key = key as? String, let value = value as? String { headers[key.lowercased()] = value }
            }
            return AppleHTTPResponse(status: http.statusCode, body: Array(data), headers: headers)
        } catch let error as URLError {
            let kind: AppleTransportError.Kind = error.code == .timedOut ? .timeout : .connection
            // URLError's description can include the URL, never the body: safe to keep.
            throw AppleTransportError(kind: kind, endpoint: endpoint, detail: "URLError \(error.code.rawValue)")
        }
    }
}

/// Refuses every redirect: a 307 would re-send the form (client_secret, refresh token, code) to
/// wherever `Location` points. The 3xx itself comes back as the answer, which no caller takes for success.
private final class NoRedirects: NSObject, URLSessionTaskDelegate, Sendable {
    func urlSession(
        _ session: URLSession, task: URLSessionTask, willPerformHTTPRedirection response: HTTPURLResponse,
        newRequest request: URLRequest, completionHandler: @escaping @Sendable (URLRequest?) -> Void
    ) {
        completionHandler(nil)
    }
}

/// `application/x-www-form-urlencoded`, strict: only unreserved characters pass unescaped.
package enum FormEncoding {
    private static let unreserved = CharacterSet(
        charactersIn: "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")

    package static func encode(_ fields: [(String, String)]) -> String {
        fields.map { "\(escape($0.0))=\(escape($0.1))" }.joined(separator: "&")
    }

    package static func decode(_ text: String) -> [String: String] {
        var fields: [String: String] = [:]
        for pair in text.split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            let key = unescape(String(parts[0]))
            let value = parts.count > 1 ? unescape(String(parts[1])) : ""
            if let key, let value { fields[key] = value }
        }
        return fields
    }

    private static func escape(_ text: String) -> String {
        text.addingPercentEncoding(withAllowedCharacters: unreserved) ?? ""
    }

    private static func unescape(_ text: String) -> String? {
        text.replacingOccurrences(of: "+", with: " ").removingPercentEncoding
    }
}
