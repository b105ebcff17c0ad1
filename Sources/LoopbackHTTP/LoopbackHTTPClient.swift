#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif
package import Foundation
import Locking

/// POSTs JSON to an `http://` endpoint on a loopback address over keep-alive HTTP/1.1 connections
/// of its own, each exchange a few blocking calls on the caller's thread (run it on a thread that
/// may block, never on the Swift concurrency pool). Used where URLSession's per-request cost on
/// Linux (curl handles, dispatch sources, thread hops) was most of what was measured: the webhook
/// sender's deliveries to a receiver on the same host, and `siwa simulate sign-in`'s load driver.
///
/// Every exchange is bounded by its deadline (connect, write and read share it); a redirect is an
/// answer like any other (never followed); bodies come with `Content-Length`, chunked, or up to the
/// end of the stream; a body is read in full (up to 1 MiB, so the connection can be reused) and its
/// first `keptBodyBytes` kept.
package final class LoopbackHTTPClient: Sendable {
    /// The URL's path and query: where `post` sends to unless told otherwise.
    package let requestTarget: String
    /// Where to connect, in order: `localhost` is 127.0.0.1, then ::1 (a server may listen on either).
    private let addresses: [LoopbackAddress]
    private let hostHeader: String
    private let keptBodyBytes: Int
    private let idle = Locked<[LoopbackHTTPConnection]>([])

    /// nil unless `url` is `http://` to a numeric loopback address or `localhost`. Answers keep
    /// their body's first `keptBodyBytes` (at most 1 MiB; see `LoopbackHTTPAnswer.bodyEnd`).
    package init?(url: URL, keptBodyBytes: Int) {
        guard url.scheme?.lowercased() == "http", let components = URLComponents(url: url, resolvingAgainstBaseURL: false),
            let host = components.host
        else { return nil }
        let names = host.lowercased() == "localhost" ? ["127.0.0.1", "::1"] : [host]
        let addresses = names.compactMap { LoopbackAddress(host: $0, port: components.port ?? 80) }
        guard addresses.count == names.count else { return nil }
        self.addresses = addresses
        let path = components.percentEncodedPath.isEmpty ? "/" : components.percentEncodedPath
        requestTarget = components.percentEncodedQuery.map { "\(path)?\($0)" } ?? path
        hostHeader = components.port.map { "\(url.host ?? host):\($0)" } ?? (url.host ?? host)
        self.keptBodyBytes = min(max(0, keptBodyBytes), LoopbackHTTPConnection.maximumReadBodyBytes)
    }

    /// POSTs `body` (JSON) to `target` (a path and query; the URL's own when nil) with `headers`
    /// added; blocks until the answer or `deadline`. A kept connection the server closed meanwhile
    /// (it answered nothing at all on it) is replaced once by a fresh one: nothing was answered, so
    /// sending again is a first attempt, not a repeat of a request the server acted on.
    package func post(_ body: [UInt8], to target: String? = nil, headers: [(String, String)] = [],
                      deadline: ContinuousClock.Instant) throws(LoopbackHTTPFailure) -> LoopbackHTTPAnswer
    {
        var head = "POST \(target ?? requestTarget) HTTP/1.1\r\nHost: \(hostHeader)\r\nContent-Type: application/json\r\n"
            + "Content-Length: \(body.count)\r\n"
        for (name, value) in headers { head += "\(name): \(value)\r\n" }
        let request = Array((head + "\r\n").utf8) + body
        var reused = idle.withLock { $0.popLast() }
        while true {
            let connection: LoopbackHTTPConnection
            if let kept = reused, kept.isIdleAndOpen() {
                connection = kept
            } else {
                reused?.close()
                reused = nil
                connection = try connect(deadline: deadline)
            }
            do throws(LoopbackHTTPFailure) {
                let (answer, reusable) = try connection.exchange(request, keptBodyBytes: keptBodyBytes, deadline: deadline)
                if reusable {
                    idle.withLock { $0.append(connection) }
                } else {
                    connection.close()
                }
                return answer
            } catch {
                connection.close()
                if reused != nil, error.nothingAnswered {
                    reused = nil
                    continue
                }
                throw error
            }
        }
    }

    /// A new connection to the first address that does not refuse it.
    private func connect(deadline: ContinuousClock.Instant) throws(LoopbackHTTPFailure) -> LoopbackHTTPConnection {
        var failure = LoopbackHTTPFailure.connection(operation: "connect", code: ECONNREFUSED, bytesReceived: 0)
        for address in addresses {
            do throws(LoopbackHTTPFailure) {
                return try LoopbackHTTPConnection(to: address, deadline: deadline)
            } catch {
                guard error.refusedConnect else { throw error }
                failure = error
            }
        }
        throw failure
    }
}
