import CryptoCore
import Testing

/// The throwaway CA `siwa dev` and the tests use for `https://` on loopback: what it issues reads
/// back as it should, and chains only to its own CA, only for the names it names.
@Suite struct LocalCertificateAuthorityTests {
    @Test func theServerCertificateNamesLoopbackAndChainsToItsCA() throws {
        let authority = try LocalCertificateAuthority.generate(commonName: "test CA", validitySeconds: 3600)
        let server = try authority.issueServerCertificate(
            commonName: "test server", ipAddresses: ["127.0.0.1"], dnsNames: ["localhost"], validitySeconds: 3600)

        let ca = try CertificateFacts(pem: authority.certificatePEM)
        #expect(ca.isCertificateAuthority)
        let leaf = try CertificateFacts(pem: server.certificatePEM)
        #expect(!leaf.isCertificateAuthority)
        #expect(Set(leaf.subjectAltNames) == ["IP Address:127.0.0.1", "DNS:localhost"], "\(leaf.subjectAltNames)")
        // Five minutes back for clock skew, then the validity asked for.
        #expect(leaf.validitySeconds == 3600 + 300)
        #expect(server.privateKeyPEM.hasPrefix("-----BEGIN PRIVATE KEY-----"))

        for name in ["127.0.0.1", "localhost"] {
            #expect(try CertificateFacts.verificationFailure(leafPEM: server.certificatePEM, caPEM: authority.certificatePEM, name: name) == nil)
        }
        let otherName = try CertificateFacts.verificationFailure(
            leafPEM: server.certificatePEM, caPEM: authority.certificatePEM, name: "example.com")
        #expect(otherName != nil)
        let otherIP = try CertificateFacts.verificationFailure(
            leafPEM: server.certificatePEM, caPEM: authority.certificatePEM, name: "10.0.0.1")
        #expect(otherIP != nil)
        let stranger = try LocalCertificateAuthority.generate(commonName: "another CA", validitySeconds: 3600)
        let untrusted = try CertificateFacts.verificationFailure(
            leafPEM: server.certificatePEM, caPEM: stranger.certificatePEM, name: "127.0.0.1")
        #expect(untrusted != nil)
    }

    @Test func eachCertificateHasItsOwnKey() throws {
        let authority = try LocalCertificateAuthority.generate(commonName: "test CA", validitySeconds: 60)
        let first = try authority.issueServerCertificate(commonName: "a", ipAddresses: ["127.0.0.1"], dnsNames: [], validitySeconds: 60)
        let second = try authority.issueServerCertificate(commonName: "b", ipAddresses: [], dnsNames: ["localhost"], validitySeconds: 60)
        #expect(first.privateKeyPEM != second.privateKeyPEM)
        #expect(first.certificatePEM != second.certificatePEM)
        #expect(throws: CryptoError.self) {
            try authority.issueServerCertificate(commonName: "none", ipAddresses: [], dnsNames: [], validitySeconds: 60)
        }
    }
}
