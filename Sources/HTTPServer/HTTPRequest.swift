/// One HTTP request, fully received (body included) before a handler sees it.
package struct HTTPRequest: Sendable {
    /// The method as sent, e.g. `GET`, `POST`.
    package var method: String
    /// The path without the query string, percent-decoded by libmicrohttpd.
    package var path: String
    /// Query arguments, decoded. A repeated key keeps its last value; a key without `=` maps to "".
    package var query: [String: String]
    /// Header fields keyed by lowercased name; repeated fields are joined with ", ".
    package var headers: [String: String]
    package var body: [UInt8]
    /// The peer's numeric address ("127.0.0.1", "::1"), when known.
    package var remoteAddress: String?

    package init(
        method: String, path: String, query: [String: String] = [:], headers: [String: String] = [:],
        body: [UInt8] = [], remoteAddress: String? = nil
    ) {
        self.method = method
        self.path = path
        self.query = query
        var lowered: [String: String] = [:]
        for (name, value) in headers { lowered[name.lowercased()] = value }
        self.headers = lowered
        self.body = body
        self.remoteAddress = remoteAddress
    }

    /// The value of a header field, looked up case-insensitively.
    package func header(_ name: String) -> String? { headers[name.lowercased()] }

    /// The body decoded as UTF-8 (invalid sequences become U+FFFD).
    package var bodyText: String { String(decoding: body, as: UTF8.self) }
}
