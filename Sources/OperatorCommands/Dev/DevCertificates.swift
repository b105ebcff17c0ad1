import CryptoCore
import Foundation
import Settings

/// The throwaway certificate authority of one `siwa dev` run: a CA and a server certificate for
/// 127.0.0.1 and localhost, so the fake Apple answers over `https://` as Apple does and the
/// receiver and worker take the same TLS path as in production, trusting the CA through
/// `SIWA_CA_FILE`. The files live in the run's private temporary folder (mode 0700, removed on
/// exit); the key file is 0600.
struct DevCertificates {
    /// Whether the fake Apple of `siwa dev` serves `https://` unless `SIWA_DEV_FAKE_APPLE_TLS` says.
    /// Off while the outbound client does not read `SIWA_CA_FILE`: the receiver could not fetch
    /// the fake's keys otherwise.
    static let onByDefault = true
    /// Long enough for any dev session, short enough that a leaked copy is soon useless.
    static let validitySeconds = 7 * 86_400

    /// The CA certificate (what clients trust: `SIWA_CA_FILE`, `curl --cacert`).
    var caFile: String
    var certificateFile: String
    var keyFile: String

    static func create(in directory: String) throws -> DevCertificates {
        let authority = try LocalCertificateAuthority.generate(
            commonName: "siwa dev throwaway CA", validitySeconds: validitySeconds)
        let server = try authority.issueServerCertificate(
            commonName: "siwa dev fake Apple", ipAddresses: ["127.0.0.1"], dnsNames: ["localhost"],
            validitySeconds: validitySeconds)
        let files = DevCertificates(
            caFile: directory + "/dev-ca.pem", certificateFile: directory + "/fake-apple-cert.pem",
            keyFile: directory + "/fake-apple-key.pem")
        for (path, text, mode) in [
            (files.caFile, authority.certificatePEM, 0o644), (files.certificateFile, server.certificatePEM, 0o644),
            (files.keyFile, server.privateKeyPEM, 0o600),
        ] {
            guard FileManager.default.createFile(atPath: path, contents: Data(text.utf8), attributes: [.posixPermissions: mode])
            else { throw DevError("cannot write \(path)") }
        }
        return files
    }

    /// `SIWA_DEV_FAKE_APPLE_TLS`: `on`, `off`, or unset for `onByDefault`.
    static func isOn(_ source: ConfigurationSource) throws -> Bool {
        switch try source.string("SIWA_DEV_FAKE_APPLE_TLS") {
        case nil: return onByDefault
        case "on": return true
        case "off": return false
        case let other?:
            throw ConfigurationError(variable: "SIWA_DEV_FAKE_APPLE_TLS", problem: "expected on or off, got \"\(other)\"")
        }
    }

    /// `siwa fake-apple`'s flags for this certificate.
    var fakeAppleArguments: [String] { ["--tls-cert-file", certificateFile, "--tls-key-file", keyFile] }
}
