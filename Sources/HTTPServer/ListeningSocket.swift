#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
// Also: shim.h pulls in <netinet/in.h>, so sockaddr_in may be attributed to CMicroHTTPD.
internal import CMicroHTTPD

/// Binds and listens ourselves, so that a bad address or a port in use is reported with its
/// errno, then hands the socket to libmicrohttpd (MHD_OPTION_LISTEN_SOCKET).
enum ListeningSocket {
    /// Returns a non-blocking, close-on-exec, listening socket.
    static func open(host: String, port: Int, backlog: Int32 = 1024) throws(HTTPServerError) -> Int32 {
        let address = "\(host):\(port)"
        func failure(_ code: HTTPServerError.Code, _ operation: String, _ message: String, errno: Int32? = nil)
            -> HTTPServerError
        {
            HTTPServerError(code: code, operation: operation, address: address, systemError: errno, message: message)
        }
        guard (0...65535).contains(port) else {
            throw failure(.invalidAddress, "parse address", "port must be 0...65535")
        }
        var name = host
        if name == "localhost" { name = "127.0.0.1" }
        if name.hasPrefix("["), name.hasSuffix("]") { name = String(name.dropFirst().dropLast()) }

        var storage = sockaddr_storage()
        let family: Int32
        let length: socklen_t
        if withUnsafeMutablePointer(to: &storage, { pointer in
            pointer.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { v4 in
                v4.pointee.sin_family = sa_family_t(AF_INET)
                v4.pointee.sin_port = in_port_t(UInt16(port).bigEndian)
                return inet_pton(AF_INET, name, &v4.pointee.sin_addr) == 1
            }
        }) {
            family = AF_INET
            length = socklen_t(MemoryLayout<sockaddr_in>.size)
        } else if withUnsafeMutablePointer(to: &storage, { pointer in
            pointer.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { v6 in
                v6.pointee = sockaddr_in6()
                v6.pointee.sin6_family = sa_family_t(AF_INET6)
                v6.pointee.sin6_port = in_port_t(UInt16(port).bigEndian)
                return inet_pton(AF_INET6, name, &v6.pointee.sin6_addr) == 1
            }
        }) {
            family = AF_INET6
            length = socklen_t(MemoryLayout<sockaddr_in6>.size)
        } else {
            throw failure(.invalidAddress, "parse address",
                          "host must be a numeric IPv4 or IPv6 address (\"[::1]\") or \"localhost\"")
        }

        #if canImport(Glibc)
        let type = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue)
        #else
        let type = SOCK_STREAM
        #endif
        let fd = socket(family, type, 0)
        guard fd >= 0 else { throw failure(.socketFailed, "socket", "cannot create a socket", errno: errno) }
        var one: Int32 = 1
        let optionSize = socklen_t(MemoryLayout<Int32>.size)
        guard setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, optionSize) == 0,
              family == AF_INET || setsockopt(fd, Int32(IPPROTO_IPV6), IPV6_V6ONLY, &one, optionSize) == 0
        else {
            let error = errno
            close(fd)
            throw failure(.socketFailed, "setsockopt", "cannot set socket options", errno: error)
        }
        let bound = withUnsafePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) }
        }
        guard bound == 0 else {
            let error = errno
            close(fd)
            switch error {
            case EADDRINUSE: throw failure(.addressInUse, "bind", "address already in use", errno: error)
            case EADDRNOTAVAIL: throw failure(.invalidAddress, "bind", "address not available here", errno: error)
            default: throw failure(.socketFailed, "bind", "cannot bind", errno: error)
            }
        }
        guard listen(fd, backlog) == 0 else {
            let error = errno
            close(fd)
            throw failure(.socketFailed, "listen", "cannot listen", errno: error)
        }
        return fd
    }

    /// The local port of a bound socket (the real one after binding port 0).
    static func localPort(of fd: Int32) -> Int {
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let result = withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        guard result == 0 else { return 0 }
        return withUnsafePointer(to: &storage) { pointer in
            if Int32(pointer.pointee.ss_family) == AF_INET6 {
                return pointer.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) {
                    Int(UInt16(bigEndian: $0.pointee.sin6_port))
                }
            }
            return pointer.withMemoryRebound(to: sockaddr_in.self, capacity: 1) {
                Int(UInt16(bigEndian: $0.pointee.sin_port))
            }
        }
    }
}
