package import Foundation
package import Logging
package import Postgres
package import AppAPI
package import Webhooks
package import AppleJobs
package import Settings

/// `siwa-worker`'s settings (every one in `SettingCatalog`, listed in deploy/README.md's
/// "Configuration reference"). Built once in `main`;
/// a missing or invalid value throws `ConfigurationError` (exit status 2, nothing started).
package struct WorkerConfiguration: Sendable {
    /// What it reads: the settings the catalog lists for the worker (app API and webhooks included).
    package static let variables = SettingCatalog.names(readBy: .worker)

    /// What the Apple handlers need (they parse the key and the token keys themselves).
    package struct Apple: Sendable {
        /// false when `SIWA_APPLE_CALLS=disabled`: then the other fields may be empty.
        package var callsEnabled: Bool
        package var baseURL: URL
        package var teamID: String
        package var keyID: String
        package var privateKeyPath: String
        /// `SIWA_TOKEN_KEYS` as given, in order (the first encrypts): `(id, base64 of 32 bytes)`.
        package var tokenKeys: [(id: String, base64: String)]
        /// `SIWA_RECONCILE=daily`: check active accounts' refresh tokens with Apple at most once a day.
        package var reconcileDaily: Bool
        /// `SIWA_PAUSE_PROBE_INTERVAL`: how long a client ID Apple refused (`invalid_client`) stays
        /// paused before one job probes it again.
        package var pauseInterval: Duration = .seconds(300)
        /// `SIWA_CA_FILE`: certificates trusted for calls to Apple besides the system's.
        package var caCertificates: String?
    }

    package var databaseURL: String
    package var clientIDs: [String]
    /// `SIWA_APP_GROUPS`: client IDs that share users (a notification for one applies to the
    /// accounts of all); each group lists at least two IDs, each in `clientIDs` and in one group.
    package var appGroups: [[String]] = []
    package var apple: Apple
    package var concurrency: Int
    package var retentionDays: Int
    package var opsListen: ListenAddress
    package var logLevel: Logger.Level
    /// Longest wait between claims when no NOTIFY arrives.
    package var pollInterval: Duration
    /// false: poll only (PgBouncer in transaction pooling mode passes no NOTIFY).
    package var listenNotify: Bool
    package var jobLease: Duration
    package var shutdownGrace: Duration
    package var completedJobRetention: Duration
    /// Notification jobs per claim-and-apply transaction. The effects are applied set-based, so a
    /// batch costs a few statements and one commit (fsync) whatever its size: larger batches
    /// amortise the commit (deploy/bench/worker.sh: 100 → ~10k jobs/s, 250 → ~13k, 500 → ~18k
    /// on one connection); at a steady trickle batches stay small, so latency does not grow.
    package var notificationBatch: Int
    /// Notification batches in flight at once, each on its own connection. One batch leaves
    /// PostgreSQL idle while its commit waits for the disk and while the worker reads the result;
    /// a second one fills those gaps.
    package var notificationConnections: Int
    /// `locked_by` on claimed rows; defaults to host:pid.
    package var workerID: String
    /// `SIWA_RETRY_BASE`: the first failure's backoff ceiling; it doubles per failure (full jitter), up to an hour.
    package var retryBase: Duration
    /// The app API, when `SIWA_APP_API_LISTEN` is set (it needs the Apple credentials).
    package var appAPI: AppAPIConfiguration?
    /// `SIWA_WEBHOOK_URL` + `SIWA_WEBHOOK_SECRET`: nil when webhooks are off.
    package var webhook: WebhookSettings?

    /// `SIWA_WORKER_STATEMENT_TIMEOUT`: the worker sessions' `statement_timeout` and `lock_timeout`,
    /// so a held lock or a stalled server fails a claim (retried) instead of hanging the worker.
    package var statementTimeout: Duration

    /// The bounds every worker session gets. A lock wait gives up at half the statement's bound,
    /// so the log names the lock (55P03) rather than a timeout (57014) when one is the cause.
    package var sessionLimits: SessionLimits {
        SessionLimits(statementTimeout: statementTimeout, lockTimeout: statementTimeout / 2)
    }

    package init(_ source: ConfigurationSource) throws(ConfigurationError) {
        try source.rejectUnknownFlags(Self.variables)
        databaseURL = try CommonSettings.databaseURL(source)
        clientIDs = try CommonSettings.clientIDs(source)
        let common = try CommonSettings(source)
        logLevel = common.logLevel
        appGroups = try Self.parseAppGroups(try source.string("SIWA_APP_GROUPS") ?? "", clientIDs: clientIDs)

        let callsText = try source.string("SIWA_APPLE_CALLS") ?? "enabled"
        guard ["enabled", "disabled"].contains(callsText) else {
            throw ConfigurationError(variable: "SIWA_APPLE_CALLS", problem: "expected enabled or disabled, got \"\(callsText)\"")
        }
        let callsEnabled = callsText == "enabled"
        func appleValue(_ variable: String) throws(ConfigurationError) -> String {
            if callsEnabled {
                guard let value = try source.string(variable) else {
                    throw ConfigurationError(variable: variable, problem: "is required (unless SIWA_APPLE_CALLS=disabled)")
                }
                return value
            }
            return try source.string(variable) ?? ""
        }
        let teamID = try appleValue("SIWA_TEAM_ID")
        let keyID = try appleValue("SIWA_KEY_ID")
        let keyPath = try appleValue("SIWA_PRIVATE_KEY_FILE")
        if !keyPath.isEmpty, !FileManager.default.isReadableFile(atPath: keyPath) {
            throw ConfigurationError(variable: "SIWA_PRIVATE_KEY_FILE", problem: "cannot read \(keyPath)")
        }
        let tokenKeysText = try appleValue("SIWA_TOKEN_KEYS")
        let tokenKeys = tokenKeysText.isEmpty ? [] : try Self.parseTokenKeys(tokenKeysText)
        let reconcileDaily: Bool
        switch try source.string("SIWA_RECONCILE")?.lowercased() {
        case nil, "off": reconcileDaily = false
        case "daily": reconcileDaily = true
        case let other?: throw ConfigurationError(variable: "SIWA_RECONCILE", problem: "expected daily or off, got \"\(other)\"")
        }
        apple = Apple(
            callsEnabled: callsEnabled, baseURL: common.appleBaseURL, teamID: teamID, keyID: keyID,
            privateKeyPath: keyPath, tokenKeys: tokenKeys, reconcileDaily: reconcileDaily)
        apple.caCertificates = common.caCertificates
        apple.pauseInterval = try Self.duration(
            source, "SIWA_PAUSE_PROBE_INTERVAL", default: .seconds(300), range: .seconds(1) ... .seconds(86_400))

        concurrency = try source.integer("SIWA_WORKER_CONCURRENCY", default: 4, range: 1...1024)
        retentionDays = try source.integer("SIWA_RETENTION_DAYS", default: 30, range: 1...36_500)
        opsListen = try source.listenAddress("SIWA_OPS_LISTEN", default: "127.0.0.1:9090")
        pollInterval = try Self.duration(source, "SIWA_POLL_INTERVAL", default: .seconds(1), range: .milliseconds(10) ... .seconds(3600))
        let notifyText = (try source.string("SIWA_LISTEN_NOTIFY") ?? "true").lowercased()
        guard let notify = ["true": true, "1": true, "yes": true, "false": false, "0": false, "no": false][notifyText] else {
            throw ConfigurationError(variable: "SIWA_LISTEN_NOTIFY", problem: "expected true or false, got \"\(notifyText)\"")
        }
        listenNotify = notify
        jobLease = try Self.duration(source, "SIWA_JOB_LEASE", default: .seconds(60), range: .seconds(1) ... .seconds(86_400))
        shutdownGrace = try Self.duration(source, "SIWA_SHUTDOWN_GRACE", default: .seconds(30), range: .zero ... .seconds(3600))
        completedJobRetention = try Self.duration(
            source, "SIWA_COMPLETED_JOB_RETENTION", default: .seconds(7 * 86_400), range: .seconds(60) ... .seconds(3650 * 86_400))
        notificationBatch = try source.integer("SIWA_NOTIFICATION_BATCH", default: 250, range: 1...1000)
        notificationConnections = try source.integer("SIWA_NOTIFICATION_CONNECTIONS", default: 2, range: 1...16)
        statementTimeout = try source.duration(
            "SIWA_WORKER_STATEMENT_TIMEOUT", default: .seconds(60), range: .milliseconds(100) ... .seconds(3600))
        retryBase = try Self.duration(source, "SIWA_RETRY_BASE", default: .seconds(1), range: .milliseconds(10) ... .seconds(3600))
        appAPI = try AppAPIConfiguration(source)
        if appAPI != nil, !callsEnabled {
            throw ConfigurationError(
                variable: "SIWA_APP_API_LISTEN", problem: "the app API exchanges codes at sign-in: it needs SIWA_APPLE_CALLS=enabled")
        }
        webhook = try WebhookSettings.parse(source)
        let host = ProcessInfo.processInfo.hostName
        workerID = try source.string("SIWA_WORKER_ID") ?? "\(host):\(ProcessInfo.processInfo.processIdentifier)"
    }

    /// `a,b;c,d`: `;`-separated groups of `,`-separated client IDs.
    package static func parseAppGroups(_ text: String, clientIDs: [String]) throws(ConfigurationError) -> [[String]] {
        var groups: [[String]] = []
        var seen: Set<String> = []
        for item in text.split(separator: ";") {
            let members = item.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
            if members.isEmpty { continue }
            for member in members {
                guard clientIDs.contains(member) else {
                    throw ConfigurationError(variable: "SIWA_APP_GROUPS", problem: "\"\(member)\" is not in SIWA_CLIENT_IDS")
                }
                guard seen.insert(member).inserted else {
                    throw ConfigurationError(variable: "SIWA_APP_GROUPS", problem: "\"\(member)\" is in more than one group")
                }
            }
            guard members.count >= 2 else {
                throw ConfigurationError(
                    variable: "SIWA_APP_GROUPS", problem: "a group needs at least two client IDs, got \"\(members[0])\" alone")
            }
            groups.append(members)
        }
        return groups
    }

    /// `id:base64(32 bytes)`, comma-separated; ids unique and non-empty.
    package static func parseTokenKeys(_ text: String) throws(ConfigurationError) -> [(id: String, base64: String)] {
        var keys: [(id: String, base64: String)] = []
        for item in text.split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces) }) where !item.isEmpty {
            guard let colon = item.firstIndex(of: ":") else {
                throw ConfigurationError(variable: "SIWA_TOKEN_KEYS", problem: "expected id:base64(32 bytes), comma-separated")
            }
            let id = String(item[..<colon])
            let value = String(item[item.index(after: colon)...])
            guard !id.isEmpty, !keys.contains(where: { $0.id == id }) else {
                throw ConfigurationError(variable: "SIWA_TOKEN_KEYS", problem: "key ids must be non-empty and unique")
            }
            guard let bytes = Data(base64Encoded: value), bytes.count == 32 else {
                throw ConfigurationError(
                    variable: "SIWA_TOKEN_KEYS", problem: "key \"\(id)\" is not base64 of exactly 32 bytes")
            }
            keys.append((id, value))
        }
        guard !keys.isEmpty else {
            throw ConfigurationError(variable: "SIWA_TOKEN_KEYS", problem: "expected id:base64(32 bytes), comma-separated")
        }
        return keys
    }

    static func duration(
        _ source: ConfigurationSource, _ variable: String, default fallback: Duration, range: ClosedRange<Duration>
    ) throws(ConfigurationError) -> Duration {
        try source.duration(variable, default: fallback, range: range)
    }
}

/// The Apple settings of a worker configuration, checked; nil when Apple calls are disabled.
package func appleSettings(_ configuration: WorkerConfiguration) throws(ConfigurationError) -> AppleSettings? {
    let apple = configuration.apple
    guard apple.callsEnabled else { return nil }
    let settings = AppleSettings(
        teamID: apple.teamID, keyID: apple.keyID, privateKeyPEMPath: apple.privateKeyPath,
        tokenKeys: apple.tokenKeys.map { "\($0.id):\($0.base64)" }.joined(separator: ","),
        baseURL: apple.baseURL, reconcileDaily: apple.reconcileDaily, pauseInterval: apple.pauseInterval,
        caCertificates: apple.caCertificates)
    try settings.validate()
    return settings
}
