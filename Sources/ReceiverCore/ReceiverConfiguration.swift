package import Foundation
package import Logging
package import Settings

/// `siwa-receiver`'s settings (`SettingCatalog`; deploy/README.md, "Configuration reference"). It
/// holds no Apple secrets.
package struct ReceiverConfiguration: Sendable {
    /// What it reads: the settings the catalog lists for the receiver.
    package static let variables = SettingCatalog.names(readBy: .receiver)

    package var databaseURL: String
    package var clientIDs: [String]
    package var listen: ListenAddress
    package var notificationPath: String
    package var appleBaseURL: URL
    /// `SIWA_CA_FILE`: certificates trusted for the key fetch besides the system's.
    package var caCertificates: String?
    package var logLevel: Logger.Level
    /// Tuning beyond the contract, with defaults that fit a 2-core machine.
    package var httpThreads: Int
    package var databaseConnections: Int
    package var maxPending: Int
    package var connectionLimit: Int
    /// Open connections from one address at most, so one host's slow clients cannot take every
    /// slot; nil for none. Unset, it is 64 when listening on a routable address and none when
    /// listening on loopback only: then a proxy on this host is every connection's address, and
    /// the per-client limit is the proxy's (deploy/nginx/siwa.conf, `limit_conn`).
    package var perAddressLimit: Int?
    /// Seconds a connection may stay idle (no bytes either way) before it is closed.
    package var connectionTimeout: Int
    /// Longest a connection may take to deliver a whole request (headers and body), from when it
    /// opened or was last answered, however steadily it trickles bytes.
    package var requestTimeout: Duration
    /// Longest a notification waits on the database before it is answered 503 (deploy/README.md,
    /// "When the database cannot store"); also the receiver sessions' `statement_timeout` and `lock_timeout`.
    package var commitTimeout: Duration
    /// Least time between two fetches of Apple's keys caused by unknown kids (seconds).
    package var keyRefetchInterval: Int
    /// The web and Android sign-in flow (`SIWA_PUBLIC_URL`); nil: not served.
    package var webSignIn: WebSignInSettings?

    package init(_ source: ConfigurationSource) throws(ConfigurationError) {
        try source.rejectUnknownFlags(Self.variables)
        databaseURL = try CommonSettings.databaseURL(source)
        clientIDs = try CommonSettings.clientIDs(source)
        listen = try source.listenAddress("SIWA_LISTEN", default: "0.0.0.0:8080")
        let path = try source.string("SIWA_NOTIFICATION_PATH") ?? "/apple/notifications"
        guard path.hasPrefix("/"), !path.contains("?"), !path.contains(" ") else {
            throw ConfigurationError(variable: "SIWA_NOTIFICATION_PATH", problem: "expected a path starting with /, got \"\(path)\"")
        }
        notificationPath = path
        let common = try CommonSettings(source)
        appleBaseURL = common.appleBaseURL
        caCertificates = common.caCertificates
        logLevel = common.logLevel
        let cores = max(1, ProcessInfo.processInfo.activeProcessorCount)
        httpThreads = try source.integer("SIWA_RECEIVER_THREADS", default: cores, range: 1...256)
        // One connection commits everything that queued during the previous commit. Measured on 2
        // cores (deploy/bench/receiver.sh), 1 beats 2, 4 and 8: bigger batches, fewer commits and
        // thread switches. More only help when one commit's round trip is the limit.
        databaseConnections = try source.integer("SIWA_RECEIVER_DB_CONNECTIONS", default: 1, range: 1...64)
        maxPending = try source.integer("SIWA_RECEIVER_MAX_PENDING", default: 4096, range: 1...1_000_000)
        connectionLimit = try source.integer("SIWA_RECEIVER_CONNECTION_LIMIT", default: 2048, range: 1...100_000)
        let behindLocalProxy = CommonSettings.isLoopback(listen.host)
        perAddressLimit =
            try source.string("SIWA_RECEIVER_PER_ADDRESS_LIMIT") == nil && behindLocalProxy
            ? nil : try source.integer("SIWA_RECEIVER_PER_ADDRESS_LIMIT", default: min(64, connectionLimit), range: 1...100_000)
        connectionTimeout = try source.integer("SIWA_RECEIVER_CONNECTION_TIMEOUT", default: 10, range: 1...3600)
        requestTimeout = try source.duration(
            "SIWA_RECEIVER_REQUEST_TIMEOUT", default: .seconds(30), range: .milliseconds(200) ... .seconds(3600))
        commitTimeout = try source.duration(
            "SIWA_RECEIVER_COMMIT_TIMEOUT", default: .seconds(5), range: .milliseconds(100) ... .seconds(600))
        keyRefetchInterval = try source.integer("SIWA_JWKS_REFETCH_INTERVAL", default: 10, range: 1...3600)
        webSignIn = try WebSignInSettings.read(source)
    }
}
