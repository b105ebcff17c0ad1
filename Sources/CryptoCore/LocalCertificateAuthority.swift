internal import COpenSSL

/// A throwaway certificate authority for HTTPS on this machine (`siwa dev`, tests): an EC P-256
/// key and a self-signed CA certificate, which issues server certificates for loopback names.
/// Nothing here is meant for a certificate anyone else trusts.
package struct LocalCertificateAuthority: Sendable {
    /// The CA certificate, PEM: what a client is given to trust (`SIWA_CA_FILE`, `curl --cacert`).
    package let certificatePEM: String
    private let key: EVPKey
    private let certificate: X509Certificate

    /// A server certificate and its private key, both PEM. The key is secret: never log it.
    package struct ServerIdentity: Sendable {
        package var certificatePEM: String
        package var privateKeyPEM: String
    }

    /// A new CA named `commonName`, valid from five minutes ago (clock skew) for `validitySeconds`.
    package static func generate(commonName: String, validitySeconds: Int) throws(CryptoError) -> LocalCertificateAuthority {
        let key = try P256.Signing.PrivateKey.generate().key
        let certificate = try X509Certificate.build(
            subject: commonName, publicKey: key, validitySeconds: validitySeconds, issuer: nil,
            extensions: [
                (NID_basic_constraints, "critical,CA:TRUE,pathlen:0"),
                (NID_key_usage, "critical,keyCertSign,cRLSign"),
                (NID_subject_key_identifier, "hash"),
            ],
            signingKey: key)
        return LocalCertificateAuthority(certificatePEM: try certificate.pem(), key: key, certificate: certificate)
    }

    /// A leaf certificate for a TLS server at `ipAddresses` and `dnsNames` (subjectAltName: what
    /// clients check), with a fresh P-256 key, signed by this CA.
    package func issueServerCertificate(
        commonName: String, ipAddresses: [String], dnsNames: [String], validitySeconds: Int
    ) throws(CryptoError) -> ServerIdentity {
        guard !ipAddresses.isEmpty || !dnsNames.isEmpty else {
            throw .invalidParameter("LocalCertificateAuthority.issueServerCertificate", "no name to certify")
        }
        let names = ipAddresses.map { "IP:\($0)" } + dnsNames.map { "DNS:\($0)" }
        let leafKey = try P256.Signing.PrivateKey.generate().key
        let leaf = try X509Certificate.build(
            subject: commonName, publicKey: leafKey, validitySeconds: validitySeconds, issuer: certificate,
            extensions: [
                (NID_basic_constraints, "critical,CA:FALSE"),
                (NID_key_usage, "critical,digitalSignature"),
                (NID_ext_key_usage, "serverAuth"),
                (NID_subject_alt_name, names.joined(separator: ",")),
                (NID_subject_key_identifier, "hash"),
                (NID_authority_key_identifier, "keyid:always"),
            ],
            signingKey: key)
        return ServerIdentity(certificatePEM: try leaf.pem(), privateKeyPEM: leafKey.privateKeyPEM())
    }
}

/// What a PEM certificate says, for checks: read back with OpenSSL's parser.
package struct CertificateFacts: Sendable, Equatable {
    /// The subjectAltName extension as OpenSSL prints it (`IP Address:127.0.0.1, DNS:localhost`).
    package var subjectAltNames: [String]
    /// basicConstraints CA:TRUE (X509_check_ca).
    package var isCertificateAuthority: Bool
    package var validitySeconds: Int

    package init(pem: String) throws(CryptoError) {
        let certificate = try X509Certificate(pem: pem)
        subjectAltNames = certificate.subjectAltNames()
        isCertificateAuthority = X509_check_ca(certificate.pointer) > 0
        validitySeconds = certificate.validitySeconds()
    }

    /// Whether `leafPEM` chains to `caPEM` (X509_verify_cert) and is valid for the IP address or
    /// host name `name`. nil when it verifies; otherwise OpenSSL's reason.
    package static func verificationFailure(leafPEM: String, caPEM: String, name: String) throws(CryptoError) -> String? {
        let leaf = try X509Certificate(pem: leafPEM)
        let authority = try X509Certificate(pem: caPEM)
        guard let store = X509_STORE_new() else { throw .openSSL("X509_STORE_new") }
        defer { X509_STORE_free(store) }
        guard X509_STORE_add_cert(store, authority.pointer) == 1 else { throw .openSSL("X509_STORE_add_cert") }
        guard let context = X509_STORE_CTX_new() else { throw .openSSL("X509_STORE_CTX_new") }
        defer { X509_STORE_CTX_free(context) }
        guard X509_STORE_CTX_init(context, store, leaf.pointer, nil) == 1 else { throw .openSSL("X509_STORE_CTX_init") }
        let parameters = X509_STORE_CTX_get0_param(context)
        let isIPAddress = name.allSatisfy { $0.isNumber || $0 == "." || $0 == ":" }
        let named = isIPAddress ? X509_VERIFY_PARAM_set1_ip_asc(parameters, name) : X509_VERIFY_PARAM_set1_host(parameters, name, 0)
        guard named == 1 else { throw .invalidParameter("CertificateFacts.verificationFailure", "not a usable name") }
        if X509_verify_cert(context) == 1 { return nil }
        _ = drainOpenSSLErrors()
        return String(cString: X509_verify_cert_error_string(Int(X509_STORE_CTX_get_error(context))))
    }
}

/// Owns one `X509*`.
/// @unchecked Sendable: built once, never modified after; OpenSSL reads it from any thread.
private final class X509Certificate: @unchecked Sendable {
    let pointer: OpaquePointer

    init(taking pointer: OpaquePointer) { self.pointer = pointer }

    convenience init(pem: String) throws(CryptoError) {
        let parsed = withMemoryBIO(reading: pem) { bio in PEM_read_bio_X509(bio, nil, nil, nil) }
        guard let parsed else { throw .openSSL("PEM_read_bio_X509", code: .invalidParameter) }
        self.init(taking: parsed)
    }

    deinit { X509_free(pointer) }

    /// A v3 certificate for `subject` (its CN), self-signed when `issuer` is nil.
    static func build(
        subject: String, publicKey: EVPKey, validitySeconds: Int, issuer: X509Certificate?,
        extensions: [(nid: Int32, value: String)], signingKey: EVPKey
    ) throws(CryptoError) -> X509Certificate {
        guard let pointer = X509_new() else { throw .openSSL("X509_new") }
        let certificate = X509Certificate(taking: pointer)
        guard X509_set_version(pointer, 2) == 1 else { throw .openSSL("X509_set_version") }
        // A random positive 63-bit serial: two certificates of one CA never share one in practice.
        let serial = SecureRandom.bytes(count: 8).reduce(Int64(0)) { ($0 << 8) | Int64($1) } & Int64.max
        guard ASN1_INTEGER_set_int64(X509_get_serialNumber(pointer), max(serial, 1)) == 1 else {
            throw .openSSL("ASN1_INTEGER_set_int64")
        }
        guard X509_gmtime_adj(X509_getm_notBefore(pointer), -300) != nil,
            X509_gmtime_adj(X509_getm_notAfter(pointer), validitySeconds) != nil
        else { throw .openSSL("X509_gmtime_adj") }
        guard X509_set_pubkey(pointer, publicKey.pointer) == 1 else { throw .openSSL("X509_set_pubkey") }
        let name = X509_get_subject_name(pointer)
        guard X509_NAME_add_entry_by_txt(name, "CN", COpenSSL_MBSTRING_UTF8, subject, -1, -1, 0) == 1 else {
            throw .openSSL("X509_NAME_add_entry_by_txt")
        }
        guard X509_set_issuer_name(pointer, issuer.map { X509_get_subject_name($0.pointer) } ?? name) == 1 else {
            throw .openSSL("X509_set_issuer_name")
        }
        for (nid, value) in extensions {
            guard COpenSSL_add_extension(pointer, issuer?.pointer ?? pointer, nid, value) == 1 else {
                throw .openSSL("X509V3_EXT_conf_nid(\(String(cString: OBJ_nid2sn(nid))))")
            }
        }
        guard X509_sign(pointer, signingKey.pointer, EVP_sha256()) > 0 else { throw .openSSL("X509_sign") }
        return certificate
    }

    func pem() throws(CryptoError) -> String {
        writeToMemoryBIO("PEM_write_bio_X509") { bio in PEM_write_bio_X509(bio, pointer) }
    }

    func subjectAltNames() -> [String] {
        let index = X509_get_ext_by_NID(pointer, NID_subject_alt_name, -1)
        guard index >= 0, let extensionPointer = X509_get_ext(pointer, index) else { return [] }
        let text = writeToMemoryBIO("X509V3_EXT_print") { bio in X509V3_EXT_print(bio, extensionPointer, 0, 0) }
        return text.split(separator: ",").map { String($0.drop { $0 == " " || $0 == "\n" }) }
    }

    func validitySeconds() -> Int {
        var days: Int32 = 0
        var seconds: Int32 = 0
        guard ASN1_TIME_diff(&days, &seconds, X509_get0_notBefore(pointer), X509_get0_notAfter(pointer)) == 1 else { return 0 }
        return Int(days) * 86_400 + Int(seconds)
    }
}
