#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Where a loopback endpoint listens: IPv4 127.0.0.0/8 (`localhost` is 127.0.0.1) or IPv6 ::1.
struct LoopbackAddress: Sendable {
    let family: Int32
    let storage: sockaddr_storage
    let length: socklen_t

    init?(host: String, port: Int) {
        guard (0...65535).contains(port) else { return nil }
        let name = host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
        var storage = sockaddr_storage()
        let isIPv4 = withUnsafeMutablePointer(to: &storage) { pointer in
            pointer.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { v4 in
                v4.pointee.sin_family = sa_family_t(AF_INET)
                v4.pointee.sin_port = in_port_t(UInt16(port).bigEndian)
                return inet_pton(AF_INET, name, &v4.pointee.sin_addr) == 1
            }
        }
        if isIPv4, name.hasPrefix("127.") {
            family = AF_INET
            length = socklen_t(MemoryLayout<sockaddr_in>.size)
        } else if name == "::1" {
            storage = sockaddr_storage()
            withUnsafeMutablePointer(to: &storage) { pointer in
                pointer.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { v6 in
                    v6.pointee.sin6_family = sa_family_t(AF_INET6)
                    v6.pointee.sin6_port = in_port_t(UInt16(port).bigEndian)
                    _ = inet_pton(AF_INET6, name, &v6.pointee.sin6_addr)
                }
            }
            family = AF_INET6
            length = socklen_t(MemoryLayout<sockaddr_in6>.size)
        } else {
            return nil
        }
        self.storage = storage
    }
}
