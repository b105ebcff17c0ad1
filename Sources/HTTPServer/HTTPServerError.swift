#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Why the server could not start, with the operation that failed and the address it was for.
package struct HTTPServerError: Error, CustomStringConvertible, Sendable {
    package struct Code: Hashable, Sendable, CustomStringConvertible {
        private enum Base: String, Hashable, Sendable {
            case invalidAddress, addressInUse, socketFailed, daemonStartFailed, alreadyRunning, tlsUnavailable
            case tlsIdentityUnreadable
        }
        private let base: Base
        private init(_ base: Base) { self.base = base }

        /// The host is not a numeric IPv4/IPv6 address or "localhost", or is not local to this machine.
        package static let invalidAddress = Code(.invalidAddress)
        /// Another socket is bound to the address and port.
        package static let addressInUse = Code(.addressInUse)
        /// socket/setsockopt/bind/listen failed for another reason (see `systemError`).
        package static let socketFailed = Code(.socketFailed)
        /// libmicrohttpd refused to start (see `message`, from its log).
        package static let daemonStartFailed = Code(.daemonStartFailed)
        /// `start()` was called on a running server.
        package static let alreadyRunning = Code(.alreadyRunning)
        /// HTTPS was asked for and this libmicrohttpd was built without TLS.
        package static let tlsUnavailable = Code(.tlsUnavailable)
        /// A certificate or key file could not be read (`address` is its path).
        package static let tlsIdentityUnreadable = Code(.tlsIdentityUnreadable)

        package var description: String { base.rawValue }
    }

    package var code: Code
    /// The call that failed: `bind`, `listen`, `MHD_start_daemon`, ...
    package var operation: String
    /// `host:port` as configured.
    package var address: String
    /// `errno` from the failing call, when there was one.
    package var systemError: Int32?
    package var message: String

    package init(code: Code, operation: String, address: String, systemError: Int32? = nil, message: String) {
        self.code = code
        self.operation = operation
        self.address = address
        self.systemError = systemError
        self.message = message
    }

    package var description: String {
        var text = "HTTPServerError.\(code): \(operation) \(address): \(message)"
        if let systemError { text += " (errno \(systemError): \(String(cString: strerror(systemError))))" }
        return text
    }
}
