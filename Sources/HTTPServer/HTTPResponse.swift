/// A complete response. `Content-Length` is computed by the server; `Content-Type` is always sent
/// (`application/octet-stream` when the headers do not name one).
package struct HTTPResponse: Sendable {
    package var status: Int
    /// Header fields in order; a name may repeat.
    package var headers: [(name: String, value: String)]
    package var body: [UInt8]

    package init(status: Int, headers: [(name: String, value: String)] = [], body: [UInt8] = []) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    /// The first value of a header field, looked up case-insensitively.
    package func header(_ name: String) -> String? {
        let lowered = name.lowercased()
        return headers.first { $0.name.lowercased() == lowered }?.value
    }

    /// `application/json` with the given, already encoded, JSON text.
    package static func json(status: Int = 200, _ json: String) -> HTTPResponse {
        HTTPResponse(status: status, headers: [("Content-Type", "application/json")], body: Array(json.utf8))
    }

    /// `text/plain; charset=utf-8`.
    package static func text(status: Int = 200, _ text: String) -> HTTPResponse {
        HTTPResponse(status: status, headers: [("Content-Type", "text/plain; charset=utf-8")], body: Array(text.utf8))
    }

    /// An empty body, e.g. 204 or 202.
    package static func empty(status: Int) -> HTTPResponse {
        HTTPResponse(status: status, headers: [("Content-Type", "text/plain; charset=utf-8")])
    }

    /// What the server sends on its own behalf (413, 503): a short JSON error.
    static func serverError(status: Int, _ code: String) -> HTTPResponse {
        .json(status: status, #"{"error":"\#(code)"}"#)
    }
}
