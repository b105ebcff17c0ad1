#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif
import Synchronization

/// A loopback port that refuses connections and that no other process can take: a socket bound to
/// it and never listening (a connection attempt is reset: "connection refused"). Bound with
/// SO_REUSEADDR, so a server of ours that also sets it (HTTPServer does) can bind and listen on
/// the same port later, while this one still holds it: a test brings "the endpoint back up" on
/// the very port it was refused on, with no moment where the port was free for anyone else.
/// (A port found free and closed may be taken by another process first.)
package final class RefusingPort: Sendable {
    package let port: Int
    /// The bound socket, -1 once released.
    private let descriptor: Mutex<Int32>

    package init() throws(RefusingPortError) {
        let socketFD = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard socketFD >= 0 else { throw RefusingPortError(operation: "socket", errno: errno) }
        var one: Int32 = 1
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        // SO_REUSEADDR before the bind: both sockets must carry it for the server's bind to share the port.
        guard setsockopt(socketFD, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size)) == 0,
            withUnsafePointer(to: &address, { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(socketFD, $0, length) } }) == 0,
            withUnsafeMutablePointer(to: &address, {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(socketFD, $0, &length) }
            }) == 0
        else {
            let error = RefusingPortError(operation: "bind", errno: errno)
            closeDescriptor(socketFD)
            throw error
        }
        descriptor = Mutex(socketFD)
        port = Int(UInt16(bigEndian: address.sin_port))
    }

    deinit { release() }

    /// Gives the port up (after a server of ours bound it, or at the end of the test).
    package func release() {
        descriptor.withLock { descriptor in
            if descriptor >= 0 { closeDescriptor(descriptor) }
            descriptor = -1
        }
    }
}

package struct RefusingPortError: Error, CustomStringConvertible {
    package let operation: String
    package let errno: Int32
    package var description: String { "RefusingPort: \(operation) failed (errno \(errno))" }
}

/// close(2), out of reach of the names above.
private func closeDescriptor(_ descriptor: Int32) {
    _ = close(descriptor)
}
