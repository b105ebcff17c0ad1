#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// What a server needs to answer over HTTPS: its certificate (PEM, the leaf first, then any
/// intermediates) and the certificate's private key (PEM). The key never appears in a description.
package struct TLSIdentity: Sendable, CustomStringConvertible {
    package var certificateChainPEM: String
    package var privateKeyPEM: String

    /// TLS 1.2 and 1.3 only, GnuTLS's default ciphers for them (libmicrohttpd uses GnuTLS).
    static let priorities = "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2"

    package init(certificateChainPEM: String, privateKeyPEM: String) {
        self.certificateChainPEM = certificateChainPEM
        self.privateKeyPEM = privateKeyPEM
    }

    /// Reads the two PEM files; the error names the file that could not be read, never its content.
    package init(certificateFile: String, keyFile: String) throws(HTTPServerError) {
        func read(_ path: String, _ what: String) throws(HTTPServerError) -> String {
            guard let text = Self.readSmallFile(path), text.contains("-----BEGIN ") else {
                throw HTTPServerError(
                    code: .tlsIdentityUnreadable, operation: "read \(what)", address: path,
                    message: "not a readable PEM file")
            }
            return text
        }
        self.init(certificateChainPEM: try read(certificateFile, "certificate"), privateKeyPEM: try read(keyFile, "private key"))
    }

    /// The file's text, at most 1 MiB (a certificate chain is a few kB); nil when unreadable.
    private static func readSmallFile(_ path: String) -> String? {
        guard let file = fopen(path, "rb") else { return nil }
        defer { fclose(file) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while bytes.count <= 1 << 20 {
            let count = fread(&chunk, 1, chunk.count, file)
            if count == 0 { break }
            bytes += chunk[..<count]
        }
        guard ferror(file) == 0, bytes.count <= 1 << 20 else { return nil }
        return String(decoding: bytes, as: UTF8.self)
    }

    package var description: String { "TLSIdentity(certificate: \(certificateChainPEM.utf8.count) bytes, key: redacted)" }
}
