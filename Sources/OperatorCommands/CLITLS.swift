import HTTPServer
import Settings

/// `--tls-cert-file CERT.pem --tls-key-file KEY.pem`: the local servers (`fake-apple`,
/// `webhooks sink`) answer over `https://` when given both.
extension CLI {
    static let tlsFlagVariables = ["TLS_CERT_FILE", "TLS_KEY_FILE"]

    /// Both flags, or neither (nil: plain `http://`). Errors name the flag and the file, never its content.
    static func tlsIdentity(_ flags: ConfigurationSource) throws -> TLSIdentity? {
        let certificate = try flags.string("TLS_CERT_FILE")
        let key = try flags.string("TLS_KEY_FILE")
        switch (certificate, key) {
        case (nil, nil): return nil
        case (.some, nil): throw ConfigurationError(variable: "--tls-key-file", problem: "is required with --tls-cert-file")
        case (nil, .some): throw ConfigurationError(variable: "--tls-cert-file", problem: "is required with --tls-key-file")
        case (let certificate?, let key?):
            do {
                return try TLSIdentity(certificateFile: certificate, keyFile: key)
            } catch {
                throw ConfigurationError(variable: "--tls-\(error.operation.hasSuffix("key") ? "key" : "cert")-file",
                                         problem: "cannot read \(error.address) as PEM")
            }
        }
    }
}
