#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Why an exchange got no answer. The description names the operation and the errno, never any
/// byte of the request or the answer.
package enum LoopbackHTTPFailure: Error, CustomStringConvertible {
    /// The exchange's deadline passed (connect, write and read share it).
    case timedOut
    /// `operation` failed with `code` (an errno), or the server closed (`code` nil) after
    /// `bytesReceived` bytes of an answer.
    case connection(operation: String, code: Int32?, bytesReceived: Int)
    case malformedAnswer(String)

    package var description: String {
        switch self {
        case .timedOut: "no answer within the timeout"
        case .connection(let operation, let code, _):
            code.map { "\(operation): errno \($0)" } ?? "\(operation): closed by the endpoint"
        case .malformedAnswer(let problem): "malformed answer: \(problem)"
        }
    }

    /// The server closed or reset before a single byte of an answer.
    var nothingAnswered: Bool {
        if case .connection(let operation, _, let received) = self { return operation != "connect" && received == 0 }
        return false
    }

    /// A refused connect: the next address of a name (`localhost`) may still be tried.
    var refusedConnect: Bool {
        guard case .connection(operation: "connect", let code?, bytesReceived: _) = self else { return false }
        return code == ECONNREFUSED || code == EADDRNOTAVAIL
    }
}
