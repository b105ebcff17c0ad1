package import Foundation
import JSON
import OutboundHTTP

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
        JSONValue.object(body)?["error"]?.stringValue
    }
}

/// A call that got no whole HTTP answer: it timed out, could not connect, or what came back was not
/// an answer we read (too large, malformed, cut short, a certificate that did not verify). Always
/// worth retrying.
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
/// on each call so no wait is unbounded. Form bodies and bearers are secrets: nothing here logs
/// them, and `HTTPFailure`'s description never holds them.
package final class AppleHTTP: Sendable {
    package let baseURL: URL
    /// `SIWA_CA_FILE`'s certificates, for a client made from this one's settings.
    package let caCertificates: String?
    private let client: HTTPClient
    private let timeout: Duration

    package init(baseURL: URL, timeout: Duration = .seconds(10), caCertificates: String? = nil) {
        self.baseURL = baseURL
        self.timeout = timeout
        self.caCertificates = caCertificates
        client = HTTPClient(extraCertificatesPEM: caCertificates)
        endpointBase = Self.endpointBase(baseURL)
    }

    /// `baseURL` with one trailing slash, to which an endpoint's path is appended: what
    /// `appendingPathComponent` gave for each call, worked out once (it cost a sign-in more than
    /// the string it built).
    private let endpointBase: String

    static func endpointBase(_ baseURL: URL) -> String {
        let text = baseURL.absoluteString
        return text.hasSuffix("/") ? text : text + "/"
    }

    /// `timeout`: at most this instead of the client's own bound, when shorter.
    package func get(_ path: String, timeout: Duration? = nil) async throws -> AppleHTTPResponse {
        try await send("GET", path, headers: [("Accept", "application/json")], body: [], timeout: timeout)
    }

    /// `bearer`: an access token for `Authorization` (user migration calls). Secret: never logged.
    package func postForm(_ path: String, fields: [(String, String)], bearer: String? = nil) async throws -> AppleHTTPResponse {
        var headers = [("Content-Type", "application/x-www-form-urlencoded"), ("Accept", "application/json")]
        if let bearer { headers.append(("Authorization", "Bearer \(bearer)")) }
        return try await send("POST", path, headers: headers, body: Array(FormEncoding.encode(fields).utf8))
    }

    private func send(
        _ method: String, _ path: String, headers: [(String, String)], body: [UInt8], timeout shorter: Duration? = nil
    ) async throws -> AppleHTTPResponse {
        let url = endpointBase + path
        let bound = shorter.map { min($0, timeout) } ?? timeout
        do {
            let response = try await client.send(HTTPRequest(method: method, url: url, headers: headers, body: body, timeout: bound))
            return AppleHTTPResponse(status: response.status, body: response.body, headers: response.headers)
        } catch {
            throw AppleTransportError(kind: error.kind == .timeout ? .timeout : .connection, endpoint: path, detail: error.description)
        }
    }
}

/// `application/x-www-form-urlencoded`, strict: only unreserved characters pass unescaped.
package enum FormEncoding {
    package static func encode(_ fields: [(String, String)]) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(fields.reduce(0) { $0 + $1.0.utf8.count + $1.1.utf8.count + 2 } + 64)
        for (index, (name, value)) in fields.enumerated() {
            if index > 0 { out.append(UInt8(ascii: "&")) }
            escape(name, into: &out)
            out.append(UInt8(ascii: "="))
            escape(value, into: &out)
        }
        return String(decoding: out, as: UTF8.self)
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

    /// By hand, not `addingPercentEncoding` (a CharacterSet lookup per character through
    /// Foundation, the largest Foundation cost of a sign-in): the same output, written into the
    /// form's one buffer (no string or table per field: a call's client_secret is 300 bytes).
    private static func escape(_ text: String, into out: inout [UInt8]) {
        func hexDigit(_ value: UInt8) -> UInt8 { value < 10 ? UInt8(ascii: "0") + value : UInt8(ascii: "A") + value - 10 }
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
                UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"):
                out.append(byte)
            default:
                out.append(UInt8(ascii: "%"))
                out.append(hexDigit(byte >> 4))
                out.append(hexDigit(byte & 0x0F))
            }
        }
    }

    private static func unescape(_ text: String) -> String? {
        text.replacingOccurrences(of: "+", with: " ").removingPercentEncoding
    }
}
