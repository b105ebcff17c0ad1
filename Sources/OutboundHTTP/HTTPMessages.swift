/// One call out: where, what, and how long it may take. `headers` and `body` may hold secrets
/// (a bearer, a client_secret): nothing in this module logs them or puts them in an error.
package struct HTTPRequest: Sendable {
    package var method: String
    /// An `http://` or `https://` URL; anything else is refused before a byte is sent.
    package var url: String
    package var headers: [(String, String)]
    package var body: [UInt8]
    /// The whole call, connect to last byte; at its end the call fails with `.timeout`.
    package var timeout: Duration
    package var bodyLimit: HTTPBodyLimit

    package init(method: String, url: String, headers: [(String, String)] = [], body: [UInt8] = [], timeout: Duration,
                 bodyLimit: HTTPBodyLimit = .whole()) {
        self.method = method
        self.url = url
        self.headers = headers
        self.body = body
        self.timeout = timeout
        self.bodyLimit = bodyLimit
    }
}

/// How much of an answer's body a call keeps. No call reads more than
/// `HTTPClient.maximumBodyBytes` of any body: past that it fails with `.tooLarge`.
package enum HTTPBodyLimit: Sendable, Equatable {
    /// The whole body, at most `bytes`; a longer one fails the call with `.tooLarge`.
    case whole(atMost: Int = HTTPClient.maximumBodyBytes)
    /// The body's first `bytes`; the rest is read (so the connection can serve again) and dropped.
    case prefix(Int)
}

/// What the other end answered.
package struct HTTPResponse: Sendable, Equatable {
    package var status: Int
    /// The answer's headers by lowercased name; a repeated header's values joined by ", ".
    package var headers: [String: String]
    package var body: [UInt8]
    /// The body was longer than `.prefix(n)` kept.
    package var bodyCut: Bool

    package init(status: Int, headers: [String: String] = [:], body: [UInt8], bodyCut: Bool = false) {
        self.status = status
        self.headers = headers
        self.body = body
        self.bodyCut = bodyCut
    }
}
