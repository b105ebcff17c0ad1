internal import Foundation
import CCurl
#if canImport(Glibc)
    import Glibc
#endif
import Locking

/// The one HTTP client of every process: Apple's endpoints, webhooks, the CLI's calls. Over
/// libcurl (`CCurl`, imported by this module only). Its rules, whatever the caller: `http://` and
/// `https://` only; certificates always verified (the system's store, plus `SIWA_CA_FILE`'s);
/// redirects never followed (a 3xx is the answer); the proxy variables honoured (libcurl reads
/// `https_proxy`/`HTTPS_PROXY`, `http_proxy`, `no_proxy`/`NO_PROXY` itself); at most 1 MiB of any
/// body held; every call bounded by its timeout; HTTP/2 over TLS when the other end offers it.
///
/// Clients with the same trust share one pool (one thread, one connection cache), so connections
/// are reused across every call of the process to the same host.
package final class HTTPClient: Sendable {
    /// The most of any answer's body a call reads.
    package static let maximumBodyBytes = 1 << 20

    private let pool: CurlPool

    /// - Parameter extraCertificatesPEM: certificates trusted besides the system's (`SIWA_CA_FILE`).
    package convenience init(extraCertificatesPEM: String? = nil) {
        self.init(trust: CurlTrust(extraCertificatesPEM: extraCertificatesPEM, systemDirectory: nil))
    }

    /// For tests: `systemDirectory` stands in for the system's hashed certificate directory.
    package convenience init(extraCertificatesPEM: String?, systemDirectory: String) {
        self.init(trust: CurlTrust(extraCertificatesPEM: extraCertificatesPEM, systemDirectory: systemDirectory))
    }

    private convenience init(trust: CurlTrust) {
        self.init(pool: Self.pools.withLock { pools in
            if let pool = pools[trust] { return pool }
            let pool = CurlPool(trust: trust)
            pools[trust] = pool
            return pool
        })
    }

    private init(pool: CurlPool) {
        self.pool = pool
    }

    /// For tests: a client whose pool (thread and connection cache) no other client shares, so
    /// what its connections do follows from its own calls alone. The pool lives as long as the process.
    package static func withOwnPool(extraCertificatesPEM: String?) -> HTTPClient {
        HTTPClient(pool: CurlPool(trust: CurlTrust(extraCertificatesPEM: extraCertificatesPEM, systemDirectory: nil)))
    }

    /// One pool per trust, for the life of the process (a process has one or two).
    private static let pools = Locked<[CurlTrust: CurlPool]>([:])

    /// Sends `request` and returns the answer, whatever its status; throws when there was no
    /// whole answer (see `HTTPFailure`). Suspends without holding a thread: the transfer runs on the
    /// pool's thread, bounded by the request's timeout. Cancelling the calling task ends the
    /// transfer at once (`cancelled`).
    package func send(_ request: HTTPRequest) async throws(HTTPFailure) -> HTTPResponse {
        if let refusal = Self.refusal(of: request.url) { throw HTTPFailure(kind: .refusedURL, detail: refusal) }
        let started = CancelGate()
        let result = await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Result<HTTPResponse, HTTPFailure>, Never>) in
                guard let handle = pool.makeHandle() else {
                    continuation.resume(returning: .failure(HTTPFailure(kind: .other, detail: "curl_easy_init failed")))
                    return
                }
                let transfer = CurlTransfer(request: request, handle: handle, continuation: continuation)
                let refused = transfer.configure(trust: pool.trust)
                guard refused == CURLE_OK else {
                    transfer.finish(refused)
                    pool.giveBack(handle)
                    return
                }
                pool.start(transfer)
                if started.set(transfer) { pool.cancel(transfer) }
            }
        } onCancel: {
            if let transfer = started.cancel() { pool.cancel(transfer) }
        }
        return try result.get()
    }

    /// Whether `url`'s host is a loopback address (127.0.0.0/8 in any form `inet_aton` reads, as
    /// curl does: `127.1` too; `::1`, `::ffff:127.x.x.x`) or `localhost` / `*.localhost`.
    package static func callsLoopback(_ url: String) -> Bool {
        var host: Substring
        if isPlainHTTPURL(url) {
            // Plain: no userinfo, no brackets; the host ends at the port, path or query.
            let rest = url.drop { $0 != "/" }.dropFirst(2)
            host = rest.prefix { $0 != ":" && $0 != "/" && $0 != "?" }
        } else {
            guard let parsed = URLComponents(string: url)?.host else { return false }
            host = Substring(parsed)
        }
        if host.hasPrefix("["), host.hasSuffix("]") { host = host.dropFirst().dropLast() }
        let name = host.lowercased()
        if name == "localhost" || name.hasSuffix(".localhost") || name == "localhost." { return true }
        var v4 = in_addr()
        if inet_aton(name, &v4) != 0 { return UInt32(bigEndian: v4.s_addr) >> 24 == 127 }
        var v6 = in6_addr()
        guard inet_pton(AF_INET6, name, &v6) == 1 else { return false }
        let bytes = withUnsafeBytes(of: &v6) { Array($0) }
        let loopback6: [UInt8] = Array(repeating: 0, count: 15) + [1]
        let mapped = bytes[0..<10].allSatisfy { $0 == 0 } && bytes[10] == 0xFF && bytes[11] == 0xFF && bytes[12] == 127
        return bytes == loopback6 || mapped
    }

    /// Why `url` is not called, or nil: only `http://` and `https://` URLs with a host.
    package static func refusal(of url: String) -> String? {
        if isPlainHTTPURL(url) { return nil }
        guard let components = URLComponents(string: url), let scheme = components.scheme?.lowercased() else {
            return "not a URL"
        }
        guard scheme == "http" || scheme == "https" else { return "the \(scheme): scheme is not called (http and https only)" }
        guard let host = components.host, !host.isEmpty else { return "the URL has no host" }
        return nil
    }

    /// The URLs of nearly every call, recognised without `URLComponents` (which costs more than the
    /// rest of a call's setup): a lowercase `http://` or `https://`, a host of letters, digits, `.`
    /// and `-` with an optional port, and a path and query of RFC 3986's unreserved characters and
    /// sub-delimiters, `:`, `@`, `/` and `?` (no `%`, no fragment). Anything else goes through `URLComponents`; both accept every URL this one does.
    package static func isPlainHTTPURL(_ url: String) -> Bool {
        var bytes = url.utf8[...]
        if bytes.starts(with: "http://".utf8) {
            bytes = bytes.dropFirst(7)
        } else if bytes.starts(with: "https://".utf8) {
            bytes = bytes.dropFirst(8)
        } else {
            return false
        }
        let authorityEnd = bytes.firstIndex { $0 == UInt8(ascii: "/") || $0 == UInt8(ascii: "?") || $0 == UInt8(ascii: "#") } ?? bytes.endIndex
        let authority = bytes[..<authorityEnd]
        let hostEnd = authority.firstIndex(of: UInt8(ascii: ":")) ?? authority.endIndex
        let host = authority[..<hostEnd]
        guard !host.isEmpty, host.allSatisfy({ isHostByte($0) }) else { return false }
        let port = authority[hostEnd...].dropFirst()
        guard hostEnd == authority.endIndex || (!port.isEmpty && port.count <= 5 && port.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }))
        else { return false }
        return bytes[authorityEnd...].allSatisfy { isPlainURLByte($0) }
    }

    private static func isHostByte(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
            UInt8(ascii: "."), UInt8(ascii: "-"):
            true
        default: false
        }
    }

    private static func isPlainURLByte(_ byte: UInt8) -> Bool {
        if isHostByte(byte) { return true }
        return switch byte {
        case UInt8(ascii: "_"), UInt8(ascii: "~"), UInt8(ascii: ":"), UInt8(ascii: "/"), UInt8(ascii: "?"),
            UInt8(ascii: "@"), UInt8(ascii: "!"), UInt8(ascii: "$"), UInt8(ascii: "&"),
            UInt8(ascii: "'"), UInt8(ascii: "("), UInt8(ascii: ")"), UInt8(ascii: "*"), UInt8(ascii: "+"), UInt8(ascii: ","),
            UInt8(ascii: ";"), UInt8(ascii: "="):
            true
        default: false
        }
    }
}

/// Between a call and its cancellation handler, which may run before the transfer exists.
private final class CancelGate: Sendable {
    private let state = Locked<(transfer: CurlTransfer?, cancelled: Bool)>((nil, false))

    /// Records the started transfer; true when the task was cancelled already.
    func set(_ transfer: CurlTransfer) -> Bool {
        state.withLock { state in
            state.transfer = transfer
            return state.cancelled
        }
    }

    /// Marks the call cancelled; returns its transfer if it started.
    func cancel() -> CurlTransfer? {
        state.withLock { state in
            state.cancelled = true
            return state.transfer
        }
    }
}
