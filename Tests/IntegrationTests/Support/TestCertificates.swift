import CryptoCore
import Foundation

/// The test process's throwaway CA's certificate and a fresh server certificate for 127.0.0.1 and
/// localhost, written into `directory` (the key file 0600), for servers the tests run over `https://`
/// (`--tls-cert-file`, `--tls-key-file`). One CA for the whole test process, so the tests' own client
/// (`HTTP.client`) trusts every such server, as `SIWA_CA_FILE` makes the receiver and worker do.
struct TestCertificates {
    let caFile: String
    let certificateFile: String
    let keyFile: String

    /// Made once per test process (an RSA/EC key and a self-signed certificate).
    static let authority: LocalCertificateAuthority = {
        do { return try LocalCertificateAuthority.generate(commonName: "siwa test CA", validitySeconds: 86_400) }
        catch { fatalError("the tests' throwaway CA: \(error)") }
    }()

    init(in directory: URL, prefix: String = "") throws {
        let authority = Self.authority
        let server = try authority.issueServerCertificate(
            commonName: "siwa test server", ipAddresses: ["127.0.0.1"], dnsNames: ["localhost"], validitySeconds: 86_400)
        caFile = directory.appendingPathComponent(prefix + "ca.pem").path
        certificateFile = directory.appendingPathComponent(prefix + "server-cert.pem").path
        keyFile = directory.appendingPathComponent(prefix + "server-key.pem").path
        for (path, text, mode) in [
            (caFile, authority.certificatePEM, 0o644), (certificateFile, server.certificatePEM, 0o644),
            (keyFile, server.privateKeyPEM, 0o600),
        ] {
            guard FileManager.default.createFile(atPath: path, contents: Data(text.utf8), attributes: [.posixPermissions: mode])
            else { throw ServiceProcessError(message: "cannot write \(path)") }
        }
    }

    var serverArguments: [String] { ["--tls-cert-file", certificateFile, "--tls-key-file", keyFile] }
}

/// Debian's curl binary, run with `arguments`, at most 30 s: the exit status and what it printed.
/// An independent client (OpenSSL's TLS, its own verification) for the servers' `https://`.
func curl(_ arguments: [String]) async throws -> (status: Int32, stdout: String, stderr: String) {
    let run = try await Siwa.run(
        ["--silent", "--show-error", "--max-time", "20"] + arguments, environment: [:], executable: "/usr/bin/curl",
        timeout: .seconds(30))
    return (run.status, run.stdout, run.stderr)
}
