#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A port on 127.0.0.1 bound and never listening: connections to it are refused, and nobody else
/// can take it until `close()`.
package final class RefusingPort: Sendable {
    package let port: Int
    private let descriptor: Int32

    package init() {
        let socketFD = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(socketFD, $0, length) } }
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(socketFD, $0, &length) }
        }
        descriptor = socketFD
        port = Int(UInt16(bigEndian: address.sin_port))
    }

    package func close() { closeDescriptor(descriptor) }
}

/// close(2), out of reach of `RefusingPort.close()`'s name.
private func closeDescriptor(_ descriptor: Int32) {
    _ = close(descriptor)
}
