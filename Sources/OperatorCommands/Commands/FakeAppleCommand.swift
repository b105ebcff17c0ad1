import CryptoCore
import FakeApple
import Foundation
import HTTPServer
import Logging
import Settings
import Lifecycle

/// `siwa fake-apple [--listen 127.0.0.1:9443] [--verify-key-file KEY.pem|.p8] [--team-id T]
/// [--recipient-team-id T2 [--recipient-verify-key-file KEY2.p8]] [--signing-key-file rsa.pem]
/// [--tls-cert-file CERT.pem --tls-key-file KEY.pem]`: a local stand-in for Apple (TEST ONLY),
/// over `https://` when given a certificate and key. Prints its base URL.
enum FakeAppleCommand: CLICommand {
    static let name = "fake-apple"
    static let summary = "run a local stand-in for Apple's token/revoke/keys endpoints (test only)"

    static func run(_ source: ConfigurationSource) async -> Int32 {
        let configuration: FakeApple.Configuration
        let signingKey: RSA.PrivateKey?
        let logLevel: Logger.Level
        do {
            let flags = source.withoutEnvironment()
            logLevel = try CommonSettings(source).logLevel
            let listen = try flags.listenAddress("LISTEN", default: "127.0.0.1:9443")
            let verifyKey = try loadVerifyKey(flags, "VERIFY_KEY_FILE")
            signingKey = try loadOrCreateSigningKey(try flags.string("SIGNING_KEY_FILE"))
            var otherTeams: [FakeApple.Team] = []
            // A second team, so a team transfer (`siwa accounts transfer`) can be rehearsed here.
            if let recipient = try flags.string("RECIPIENT_TEAM_ID") {
                otherTeams.append(.init(id: recipient, verifyKey: try loadVerifyKey(flags, "RECIPIENT_VERIFY_KEY_FILE")))
            }
            configuration = FakeApple.Configuration(
                host: listen.host, port: listen.port, verifyKey: verifyKey, teamID: try flags.string("TEAM_ID"),
                otherTeams: otherTeams, tls: try CLI.tlsIdentity(flags))
        } catch {
            FileHandle.standardError.write(Data("siwa fake-apple: \(error)\n".utf8))
            return 2
        }
        let logger = Logger(label: "fake-apple", level: logLevel)
        do {
            let fake = try FakeApple(configuration: configuration, signingKey: signingKey, logger: logger)
            try fake.start()
            FileHandle.standardOutput.write(Data("fake-apple listening on \(fake.baseURL.absoluteString)\n".utf8))
            if configuration.verifyKey == nil {
                // stdout is a pipe under `siwa dev`: write unbuffered, or the line shows up only at exit.
                FileHandle.standardOutput.write(
                    Data("fake-apple: no --verify-key-file: client_secret signatures are not checked (claims still are)\n".utf8))
            }
            let signal = await Termination.wait()
            logger.info("fake-apple stopping", metadata: ["signal": .string(signal)])
            fake.stop()
            return 0
        } catch {
            FileHandle.standardError.write(Data("siwa fake-apple: \(error)\n".utf8))
            return 1
        }
    }

    /// The P-256 public key (or `.p8`) at the path the flag names, if it names one.
    static func loadVerifyKey(_ flags: ConfigurationSource, _ variable: String) throws -> P256.Signing.PublicKey? {
        let flag = "--" + ConfigurationSource.flagName(for: variable)
        guard let path = try flags.string(variable) else { return nil }
        guard let pem = try? String(contentsOfFile: path, encoding: .utf8) else {
            throw ConfigurationError(variable: flag, problem: "cannot read \(path)")
        }
        if let key = try? P256.Signing.PublicKey(pemRepresentation: pem) { return key }
        if let key = try? P256.Signing.PrivateKey(pemRepresentation: pem) { return key.publicKey }
        throw ConfigurationError(variable: flag, problem: "not a P-256 public key or .p8")
    }

    /// Reuses the RSA key at `path` (so restarts keep the receiver's cached key valid), or creates it.
    static func loadOrCreateSigningKey(_ path: String?) throws -> RSA.PrivateKey? {
        guard let path else { return nil }
        if let pem = try? String(contentsOfFile: path, encoding: .utf8) {
            do { return try RSA.PrivateKey(pemRepresentation: pem) } catch {
                throw ConfigurationError(variable: "--signing-key-file", problem: "not an RSA private key PEM")
            }
        }
        let key = try RSA.PrivateKey.generate()
        guard FileManager.default.createFile(atPath: path, contents: Data(key.pemRepresentation.utf8), attributes: [.posixPermissions: 0o600])
        else { throw ConfigurationError(variable: "--signing-key-file", problem: "cannot write \(path)") }
        return key
    }
}
