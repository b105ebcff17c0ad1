#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A loopback port that refuses connections and that no other process can take: a socket bound to
/// it and never listening (a connection attempt is reset: "connection refused"). Bound with
/// SO_REUSEADDR, so a server of ours that also sets it (HTTPServer does) can bind and listen on
/// the same port later, while this one still holds it: a test brings "the receiver back up" on
/// the very port it was refused on, with no moment where the port was free for anyone else.
/// (A port found free and closed, as `freePort()` does, may be taken by another process first.)
final class RefusingPort: @unchecked Sendable {
    // @unchecked: the descriptor is set once and closed once, from the test's own task.
    let port: Int
    private var descriptor: Int32

    init() throws {
        let socketFD = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard socketFD >= 0 else { throw ServiceProcessError(message: "RefusingPort: socket failed (errno \(errno))") }
        var one: Int32 = 1
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        // SO_REUSEADDR before the bind: both sockets must carry it for the server's bind to share the port.
        let reusable = setsockopt(socketFD, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size)) == 0
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(socketFD, $0, length) }
        }
        guard reusable, bound == 0,
            withUnsafeMutablePointer(to: &address, {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(socketFD, $0, &length) }
            }) == 0
        else {
            let error = errno
            close(socketFD)
            throw ServiceProcessError(message: "RefusingPort: bind failed (errno \(error))")
        }
        descriptor = socketFD
        port = Int(UInt16(bigEndian: address.sin_port))
    }

    deinit { release() }

    /// Gives the port up (after a server of ours bound it, or at the end of the test).
    func release() {
        if descriptor >= 0 { close(descriptor) }
        descriptor = -1
    }
}
