/// Why a call got no whole answer. `description` is safe to log or store: it names the kind, curl's
/// error code and curl's message (host and port at most), never a header value, a body byte or the
/// URL's path or query.
package struct HTTPFailure: Error, Sendable, Equatable, CustomStringConvertible {
    package enum Kind: String, Sendable {
        /// The call's timeout passed (connect, TLS, sending or reading).
        case timeout
        /// No connection: refused, unreachable, the name did not resolve, a proxy refused the tunnel.
        case connect
        /// The TLS handshake failed or the certificate did not verify.
        case tls
        /// The answer (its headers, or its body past the call's limit) was larger than a call keeps.
        case tooLarge = "too_large"
        /// The answer is not HTTP as it must be (status line, header, chunk, HTTP/2 framing).
        case malformed
        /// The connection closed or was reset before the answer's end.
        case closed
        /// Not an `http://` or `https://` URL: nothing was sent.
        case refusedURL = "refused_url"
        /// The calling task was cancelled.
        case cancelled
        /// Anything else curl reports (out of memory, an internal error).
        case other
    }

    package var kind: Kind
    /// The answer's status when its head had arrived whole before the failure (a body cut short,
    /// too large or broken); nil when no head did.
    package var status: Int?
    /// curl's error code and message, or what the URL check refused.
    package var detail: String

    package init(kind: Kind, status: Int? = nil, detail: String) {
        self.kind = kind
        self.status = status
        self.detail = detail
    }

    package var description: String {
        let answered = status.map { " after a \($0) head" } ?? ""
        return "\(kind.rawValue)\(answered): \(detail)"
    }
}
