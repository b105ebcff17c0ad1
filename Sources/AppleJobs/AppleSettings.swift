import AppleClient
package import Foundation
package import Logging
package import Settings
import StoredTokens

/// What the Apple handlers need from configuration. Built from the same variables as the worker's
/// configuration (`SIWA_TEAM_ID`, `SIWA_KEY_ID`, `SIWA_PRIVATE_KEY_FILE`, `SIWA_TOKEN_KEYS`,
/// `SIWA_APPLE_BASE_URL`, `SIWA_RECONCILE`).
package struct AppleSettings: Sendable {
    package var teamID: String
    package var keyID: String
    package var privateKeyPEMPath: String
    /// `id:base64(32 bytes)`, comma-separated. Secret: never log it.
    package var tokenKeys: String
    package var baseURL: URL
    /// Bound on every call to Apple.
    package var timeout: Duration
    /// `SIWA_RECONCILE=daily`: check active accounts' refresh tokens at most once a day.
    package var reconcileDaily: Bool
    /// How long a client ID Apple refused stays paused before one job probes it again.
    package var pauseInterval: Duration
    /// `SIWA_CA_FILE`: certificates trusted for calls to Apple besides the system's.
    package var caCertificates: String?

    package init(
        teamID: String, keyID: String, privateKeyPEMPath: String, tokenKeys: String,
        baseURL: URL = URL(string: "https://appleid.apple.com")!, timeout: Duration = .seconds(10),
        reconcileDaily: Bool = false, pauseInterval: Duration = .seconds(300), caCertificates: String? = nil
    ) {
        self.teamID = teamID
        self.keyID = keyID
        self.privateKeyPEMPath = privateKeyPEMPath
        self.tokenKeys = tokenKeys
        self.baseURL = baseURL
        self.timeout = timeout
        self.reconcileDaily = reconcileDaily
        self.pauseInterval = pauseInterval
        self.caCertificates = caCertificates
    }

    package static let variables = [
        "SIWA_TEAM_ID", "SIWA_KEY_ID", "SIWA_PRIVATE_KEY_FILE", "SIWA_TOKEN_KEYS", "SIWA_APPLE_BASE_URL", "SIWA_RECONCILE", "SIWA_CA",
    ]

    /// Reads and checks the variables (the key file must load, the token keys must parse).
    package init(_ source: ConfigurationSource) throws(ConfigurationError) {
        let teamID = try source.require("SIWA_TEAM_ID")
        let keyID = try source.require("SIWA_KEY_ID")
        let path = try source.require("SIWA_PRIVATE_KEY_FILE")
        let tokenKeys = try source.require("SIWA_TOKEN_KEYS")
        let reconcile: Bool
        switch try source.string("SIWA_RECONCILE")?.lowercased() {
        case nil, "off", "disabled", "none": reconcile = false
        case "daily": reconcile = true
        default: throw ConfigurationError(variable: "SIWA_RECONCILE", problem: "must be daily or off")
        }
        self.init(
            teamID: teamID, keyID: keyID, privateKeyPEMPath: path, tokenKeys: tokenKeys,
            baseURL: try CommonSettings.appleBaseURL(source), reconcileDaily: reconcile,
            caCertificates: try CommonSettings.caCertificates(source))
        try validate()
    }

    /// Loads the key file and parses the token keys; errors name the variable, never a secret.
    package func validate() throws(ConfigurationError) {
        do {
            _ = try ClientSecretSigner(teamID: teamID, keyID: keyID, privateKeyFile: privateKeyPEMPath)
        } catch {
            throw ConfigurationError(variable: "SIWA_PRIVATE_KEY_FILE", problem: "cannot load a P-256 .p8 key from it")
        }
        do { _ = try TokenBox(configuration: tokenKeys) } catch {
            throw ConfigurationError(variable: "SIWA_TOKEN_KEYS", problem: "\(error)".replacingOccurrences(of: "SIWA_TOKEN_KEYS: ", with: ""))
        }
    }

    /// Warns when the `.p8` can be read by anyone but its owner: the key signs for the whole team.
    /// A warning, not a refusal: some secret stores hand keys over with group read on purpose.
    package func warnIfKeyFileIsShared(logger: Logger) {
        guard let mode = (try? FileManager.default.attributesOfItem(atPath: privateKeyPEMPath))?[.posixPermissions] as? Int,
            mode & 0o044 != 0
        else { return }
        logger.warning(
            "SIWA_PRIVATE_KEY_FILE is readable by group or others; make it 0600 (or 0400) and owned by the worker's user",
            metadata: ["file": .string(privateKeyPEMPath), "mode": .string(String(mode & 0o777, radix: 8))])
    }
}
