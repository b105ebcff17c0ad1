/// An answer's status and body, as much of the body as the client keeps.
package struct LoopbackHTTPAnswer: Sendable, Equatable {
    /// How the kept body ends.
    package enum BodyEnd: Sendable, Equatable {
        /// `body` is the whole body.
        case whole
        /// The body is longer than the client keeps: `body` is its first bytes.
        case longerThanKept
        /// The server closed the connection before the end of the body it announced.
        case cutShort
    }

    package var status: Int
    package var body: [UInt8]
    package var bodyEnd: BodyEnd

    package init(status: Int, body: [UInt8], bodyEnd: BodyEnd) {
        self.status = status
        self.body = body
        self.bodyEnd = bodyEnd
    }
}
