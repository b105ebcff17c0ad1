#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif
import CLibssl
package import Foundation

/// Which certificate a TLS-mode server presents (files under `Tests/Fixtures/tls`).
package enum TLSFixture: String, Sendable {
    /// Signed by the test CA, for `localhost` and `127.0.0.1`.
    case localhost = "localhost"
    /// Signed by the test CA, for `wrong.example` only.
    case wrongHost = "wrong-host"
    /// For `localhost` and `127.0.0.1`, signed by a CA nobody trusts.
    case unknownCA = "unknown-ca"

    package static let directory = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/tls")

    /// The test CA's certificate, PEM: what a client told to trust it (`SIWA_CA_FILE`) is given.
    package static var caPEM: String { (try? String(contentsOf: directory.appendingPathComponent("ca.pem"), encoding: .utf8)) ?? "" }
    package static var caPath: String { directory.appendingPathComponent("ca.pem").path }
}

/// An OpenSSL server context for one certificate; records the ALPN protocols clients offer (it
/// selects none, so every connection speaks HTTP/1.1, as the scripts are written).
final class TLSServerContext: @unchecked Sendable {
    // @unchecked: `context` is configured once in init; `offers` is behind its lock.
    let context: OpaquePointer
    private let offersLock = NSLock()
    private var offers: [[String]] = []

    init(_ fixture: TLSFixture) throws {
        // A write to a peer that went away would raise SIGPIPE (SSL_write cannot pass MSG_NOSIGNAL).
        signal(SIGPIPE, SIG_IGN)
        guard let context = SSL_CTX_new(TLS_server_method()) else { throw CocoaError(.fileReadUnknown) }
        self.context = context
        let certificate = TLSFixture.directory.appendingPathComponent("\(fixture.rawValue).pem").path
        let key = TLSFixture.directory.appendingPathComponent("\(fixture.rawValue).key").path
        guard SSL_CTX_use_certificate_chain_file(context, certificate) == 1,
            SSL_CTX_use_PrivateKey_file(context, key, SSL_FILETYPE_PEM) == 1
        else { throw CocoaError(.fileReadCorruptFile) }
        SSL_CTX_set_alpn_select_cb(context, { _, _, _, input, length, argument in
            guard let input, let argument else { return CLibssl_TLSEXT_ERR_NOACK }
            var names: [String] = []
            var index = 0
            while index < Int(length) {
                let size = Int(input[index])
                names.append(String(decoding: UnsafeBufferPointer(start: input + index + 1, count: min(size, Int(length) - index - 1)), as: UTF8.self))
                index += 1 + size
            }
            Unmanaged<TLSServerContext>.fromOpaque(argument).takeUnretainedValue().record(names)
            return CLibssl_TLSEXT_ERR_NOACK
        }, Unmanaged.passUnretained(self).toOpaque())
    }

    deinit { SSL_CTX_free(context) }

    private func record(_ names: [String]) { offersLock.withLock { offers.append(names) } }

    /// The ALPN lists clients offered, one per handshake.
    var alpnOffers: [[String]] { offersLock.withLock { offers } }

    /// Completes a handshake on `descriptor`; nil when it failed (the client gave up, or refused us).
    func accept(_ descriptor: Int32) -> TLSConnection? {
        guard let ssl = SSL_new(context) else { return nil }
        SSL_set_fd(ssl, descriptor)
        guard SSL_accept(ssl) == 1 else {
            SSL_free(ssl)
            return nil
        }
        return TLSConnection(ssl: ssl)
    }
}

/// One TLS connection's reads and writes (the socket itself stays the server's to close).
final class TLSConnection {
    private let ssl: OpaquePointer

    init(ssl: OpaquePointer) { self.ssl = ssl }
    deinit { SSL_free(ssl) }

    func read(into buffer: UnsafeMutableRawBufferPointer) -> Int {
        Int(SSL_read(ssl, buffer.baseAddress, Int32(buffer.count)))
    }

    func write(_ buffer: UnsafeRawBufferPointer) -> Int {
        Int(SSL_write(ssl, buffer.baseAddress, Int32(buffer.count)))
    }
}
