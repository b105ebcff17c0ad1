import AppleClient
import ChildProcesses
import Console
import HTTPServer
import CryptoCore
import Foundation
import LocalPostgres
import Logging
import Migrations
import Postgres
import Locking
import Settings

/// `siwa dev`: the whole stack on this machine. A throwaway PostgreSQL (unless `DATABASE_URL` is
/// set), `siwa fake-apple` (unless `--no-fake-apple` or `SIWA_APPLE_BASE_URL`), migrations,
/// `siwa-receiver` and one `siwa-worker`, their logs in readable form; Ctrl-C stops it all.
/// `--once` (or `SIWA_DEV_EXIT_AFTER=SECONDS`) stops after readiness, for smoke tests.
enum DevCommand: CLICommand {
    static let name = "dev"
    static let summary = "run the whole stack here: throwaway PostgreSQL, fake Apple, receiver, worker [--once]"

    static let variables = SettingCatalog.names(readBy: .dev)

    static func run(_ source: ConfigurationSource) async -> Int32 {
        let settings: DevSettings
        do {
            settings = try DevSettings(source)
        } catch {
            CLI.error(name, "\(error)")
            return 2
        }
        return await DevStack(settings: settings).run()
    }
}

/// Everything `siwa dev` reads before starting anything.
struct DevSettings {
    var databaseURL: String?
    var clientIDs: String
    var listen: ListenAddress
    var listenGiven: Bool
    var opsListen: ListenAddress
    var opsListenGiven: Bool
    /// The app API's listener (served by the worker when it can call Apple).
    var apiListen: ListenAddress
    var apiListenGiven: Bool
    /// `SIWA_APP_API_TOKENS` when given; else a fresh dev token, printed.
    var apiToken: String
    var notificationPath: String
    var appleBaseURL: URL?
    var useFakeApple: Bool
    /// The fake Apple over `https://` with a throwaway CA (`SIWA_DEV_FAKE_APPLE_TLS=on|off`).
    var fakeAppleTLS: Bool
    var logLevel: Logger.Level
    /// All four of SIWA_TEAM_ID, SIWA_KEY_ID, SIWA_PRIVATE_KEY_FILE, SIWA_TOKEN_KEYS are set.
    var hasAppleCredentials: Bool
    var once: Bool
    /// `--no-worker`: receiver only (workers run elsewhere, or are being debugged by hand).
    var startWorker: Bool
    var exitAfter: Int?
    var readyTimeout: Int
    /// Folder of `siwa`, `siwa-receiver`, `siwa-worker`.
    var binDirectory: URL

    init(_ source: ConfigurationSource) throws {
        try source.rejectUnknownFlags(DevCommand.variables)
        if try source.string("DATABASE_URL") != nil { databaseURL = try CommonSettings.databaseURL(source) }
        clientIDs = (try source.list("SIWA_CLIENT_IDS") ?? ["com.example.app"]).joined(separator: ",")
        listenGiven = try source.string("SIWA_LISTEN") != nil
        listen = try source.listenAddress("SIWA_LISTEN", default: "127.0.0.1:8080")
        opsListenGiven = try source.string("SIWA_OPS_LISTEN") != nil
        opsListen = try source.listenAddress("SIWA_OPS_LISTEN", default: "127.0.0.1:9090")
        apiListenGiven = try source.string("SIWA_APP_API_LISTEN") != nil
        apiListen = try source.listenAddress("SIWA_APP_API_LISTEN", default: "127.0.0.1:8081")
        apiToken = try source.list("SIWA_APP_API_TOKENS")?.first
            ?? "dev_" + SecureRandom.bytes(count: 24).map { String(format: "%02x", $0) }.joined()
        notificationPath = try source.string("SIWA_NOTIFICATION_PATH") ?? "/apple/notifications"
        let common = try CommonSettings(source)
        logLevel = common.logLevel
        appleBaseURL = try source.string("SIWA_APPLE_BASE_URL") != nil ? common.appleBaseURL : nil
        useFakeApple = appleBaseURL == nil && !source.isSet(switch: "no-fake-apple")
        fakeAppleTLS = try DevCertificates.isOn(source)
        hasAppleCredentials = try ["SIWA_TEAM_ID", "SIWA_KEY_ID", "SIWA_PRIVATE_KEY_FILE", "SIWA_TOKEN_KEYS"]
            .allSatisfy { try source.string($0) != nil }
        once = source.isSet(switch: "once")
        startWorker = !source.isSet(switch: "no-worker")
        exitAfter = try source.string("SIWA_DEV_EXIT_AFTER") == nil
            ? nil : try source.integer("SIWA_DEV_EXIT_AFTER", default: 0, range: 0...31_536_000)
        readyTimeout = try source.integer("SIWA_DEV_READY_TIMEOUT", default: 60, range: 1...3600)
        binDirectory = Self.executableDirectory()
    }

    /// The folder of the running `siwa` (`/proc/self/exe`, else argv[0] with symlinks resolved).
    static func executableDirectory() -> URL {
        if let path = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe") {
            return URL(fileURLWithPath: path).deletingLastPathComponent()
        }
        return URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath().deletingLastPathComponent()
    }
}

/// One run of `siwa dev`: starts in order, stops in reverse order, always cleans up.
final class DevStack: @unchecked Sendable {
    // @unchecked Sendable: mutable state is touched only by `run()`'s task; the reader threads
    // touch only `output` (Sendable).
    private let settings: DevSettings
    private let output = DevOutput()
    private let logger: Logger
    private var cluster: LocalPostgresCluster?
    private var children: [DevProcess] = []
    private let boundPorts = DevBoundPorts()
    private var console: ConsoleServer?
    private var temporaryDirectory: String?
    private var apiTokenFile = ""
    /// The first SIGINT/SIGTERM, checked by every wait so Ctrl-C works during start-up too.
    private let signalName = Locked<String?>(nil)

    init(settings: DevSettings) {
        self.settings = settings
        // say() reports each step; the libraries' own info lines only at SIWA_LOG_LEVEL=debug.
        logger = Self.formattedLogger(
            level: settings.logLevel <= .debug ? settings.logLevel : max(settings.logLevel, .warning), output: output)
    }

    /// Our own log lines (LocalPostgres, Migrator) go through a pipe and the same formatter as the children's.
    private static func formattedLogger(level: Logger.Level, output: DevOutput) -> Logger {
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { return Logger(label: "siwa-dev", level: level) }
        let readEnd = fds[0]
        Thread.detachNewThread {
            DevProcess.readLines(readEnd) { output.line(DevLogFormatter.format($0, prefix: "dev")) }
        }
        return Logger(label: "siwa-dev", level: level, sink: LogSink(fileDescriptor: fds[1]))
    }

    private func say(_ text: String) { output.line("[dev] " + text) }

    func run() async -> Int32 {
        let signals = Task { [self, output] in
            let name = await DevShutdown.wait(output: output) ?? "cancelled"
            signalName.withLock { $0 = name }
        }
        defer { signals.cancel() }
        var status: Int32 = 0
        do {
            let urls = try await start()
            printURLs(urls)
            let activity = Task { [output, logger] in
                await DevActivity(databaseURL: urls.database, output: output, logger: logger).run()
            }
            defer { activity.cancel() }
            status = try await waitUntilDone()
        } catch let error as DevStopped {
            say("\(error.signal): stopping")
        } catch {
            output.line("[dev] error: \(error)")
            status = 1
        }
        await stopAll()
        return status
    }

    // MARK: Start

    struct URLs {
        var database: String
        var receiver: String
        var endpoint: String
        var workerOps: String
        /// The app API, when the worker serves it.
        var appAPI: String?
        var fakeApple: String?
        var appleBase: String
        var console: String
        /// The throwaway CA the children trust (`SIWA_CA_FILE`), when the fake Apple serves `https://`.
        var caFile: String?
        /// A web sign-in to open in a browser (receiver → fake Apple's page → callback → the fake's return page).
        var webSignIn: String? = nil
    }

    private func start() async throws -> URLs {
        let receiverPath = settings.binDirectory.appendingPathComponent("siwa-receiver").path
        let workerPath = settings.binDirectory.appendingPathComponent("siwa-worker").path
        let siwaPath = settings.binDirectory.appendingPathComponent("siwa").path
        for path in [receiverPath] + (settings.startWorker ? [workerPath] : []) where !FileManager.default.isExecutableFile(atPath: path) {
            throw DevError(
                "\(path) is missing: build every product first (swift build, or swift build -c release)")
        }
        var template = Array((temporaryFolder() + "/siwa-dev-XXXXXX").utf8CString)
        guard mkdtemp(&template) != nil else { throw DevError("mkdtemp in \(temporaryFolder()) failed (errno \(errno))") }
        let directory = String(decoding: template.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        temporaryDirectory = directory
        OrphanReaper.shared?.watch(folder: directory)
        // The app API token goes to the lines printed below as a file, never as a flag: any user of
        // the machine can read a command line.
        apiTokenFile = directory + "/app-api-token"
        guard FileManager.default.createFile(
            atPath: apiTokenFile, contents: Data((settings.apiToken + "\n").utf8), attributes: [.posixPermissions: 0o600])
        else { throw DevError("cannot write \(apiTokenFile)") }

        // Database.
        let databaseURL: String
        if let url = settings.databaseURL {
            databaseURL = url
            say("using DATABASE_URL")
        } else {
            say("starting a throwaway PostgreSQL (initdb, pg_ctl; a few seconds)...")
            // A generated password over TCP, the socket in the cluster's 0700 folder: no other user
            // of this machine gets into the dev database (nor runs programs as its server's user).
            let password = SecureRandom.bytes(count: 16).map { String(format: "%02x", $0) }.joined()
            let cluster = try await LocalPostgresCluster.start(logger: logger, options: .init(password: password))
            self.cluster = cluster
            databaseURL = cluster.url
            say("PostgreSQL ready on port \(cluster.port) (data in \(cluster.directory), removed on exit)")
        }
        say("migrating...")
        let connection = try await PostgresConnection.connect(to: databaseURL, applicationName: "siwa-dev", logger: logger)
        let applied: Migrator.Report
        do {
            applied = try await Migrator(logger: logger).migrate(connection)
            connection.close()
        } catch {
            connection.close()
            throw error
        }
        say(applied.isEmpty ? "schema up to date" : applied.summary)

        // Apple: the fake, a given base URL, or the real one.
        var appleBase = settings.appleBaseURL?.absoluteString ?? "https://appleid.apple.com"
        var fakeApple: String?
        let certificates = settings.useFakeApple && settings.fakeAppleTLS ? try DevCertificates.create(in: directory) : nil
        if let certificates { say("the fake Apple serves https with a certificate of a throwaway CA: \(certificates.caFile)") }
        // With the fake and no real credentials: a throwaway key pair and token key, so exchange and
        // revoke run end to end, and the fake checks every client_secret signature against that key.
        let throwawayCredentials =
            settings.useFakeApple && settings.startWorker && !settings.hasAppleCredentials
            ? try makeThrowawayCredentials(in: directory) : nil
        if settings.useFakeApple {
            fakeApple = try await startFakeApple(
                siwaPath: siwaPath, credentials: throwawayCredentials, tlsArguments: certificates?.fakeAppleArguments ?? [])
            appleBase = fakeApple!
        }

        // Listeners: as given, else the defaults, or port 0 when a default is busy. A port 0 is
        // read back from the child's log once it has bound one (`DevListener`), before anything
        // that names it: the readiness checks, the printed URLs.
        var listen = settings.listen
        let defaultListenBusy = !settings.listenGiven && !DevPorts.isFree(host: listen.host, port: listen.port)
        if defaultListenBusy { listen.port = 0 }
        var opsListen = settings.opsListen
        if !settings.opsListenGiven && !DevPorts.isFree(host: opsListen.host, port: opsListen.port) {
            opsListen.port = 0
        }

        var environment = ProcessInfo.processInfo.environment
        environment["DATABASE_URL"] = databaseURL
        environment["SIWA_CLIENT_IDS"] = settings.clientIDs
        environment["SIWA_APPLE_BASE_URL"] = appleBase
        // At least info: the lines that say where a child listens are info lines. Dev shows only
        // those at the level asked for (`spawn`).
        environment["SIWA_LOG_LEVEL"] = "\(min(settings.logLevel, .info))"
        environment["SIWA_NOTIFICATION_PATH"] = settings.notificationPath
        if let certificates {
            environment["SIWA_CA_FILE"] = certificates.caFile  // replaces any file twin
            environment["SIWA_CA"] = nil
        }
        // What dev decided replaces any file twin of the same setting (both set is an error).
        for decided in ["DATABASE_URL", "SIWA_CLIENT_IDS", "SIWA_APPLE_BASE_URL", "SIWA_LOG_LEVEL", "SIWA_NOTIFICATION_PATH"] {
            environment[decided + "_FILE"] = nil
        }
        // Our own settings must not leak into the children as stray variables.
        environment["SIWA_DEV_EXIT_AFTER"] = nil
        environment["SIWA_DEV_READY_TIMEOUT"] = nil
        environment["SIWA_DEV_FAKE_APPLE_TLS"] = nil

        var receiverEnvironment = environment
        receiverEnvironment["SIWA_LISTEN"] = listen.description
        for secret in ["SIWA_TEAM_ID", "SIWA_KEY_ID", "SIWA_PRIVATE_KEY_FILE", "SIWA_TOKEN_KEYS"] {
            receiverEnvironment[secret] = nil  // the receiver holds no Apple secrets
            receiverEnvironment[secret + "_FILE"] = nil
        }
        // Web sign-in, served: the receiver on loopback is its own public URL, and the fake Apple's
        // page shows where a sign-in returns (unless the operator set either). With port 0 the
        // public URL names port 0 too, which the receiver takes as the port it bound.
        var webReturnURL: String?
        if let fakeApple, environment["SIWA_PUBLIC_URL"] == nil, CommonSettings.isLoopback(listen.host) {
            let returnURL = fakeApple + "/fake/signed-in"
            receiverEnvironment["SIWA_PUBLIC_URL"] = "http://\(Self.dialHost(listen.host)):\(listen.port)"
            receiverEnvironment["SIWA_WEB_RETURN_URLS"] = environment["SIWA_WEB_RETURN_URLS"] ?? returnURL
            webReturnURL = environment["SIWA_WEB_RETURN_URLS"] == nil ? returnURL : nil
        }
        try spawn("receiver", receiverPath, environment: receiverEnvironment, listeners: [.receiver])

        var workerEnvironment = environment
        workerEnvironment["SIWA_OPS_LISTEN"] = opsListen.description
        var apiListen = settings.apiListen
        if !settings.apiListenGiven && !DevPorts.isFree(host: apiListen.host, port: apiListen.port) {
            apiListen.port = 0
        }
        let servesAPI = settings.startWorker && (settings.hasAppleCredentials || throwawayCredentials != nil)
        if servesAPI {
            workerEnvironment["SIWA_APP_API_LISTEN"] = apiListen.description
            workerEnvironment["SIWA_APP_API_TOKENS"] = settings.apiToken
            workerEnvironment["SIWA_APP_API_TOKENS_FILE"] = nil
        } else {
            workerEnvironment["SIWA_APP_API_LISTEN"] = nil
        }
        if !settings.startWorker {
        } else if settings.hasAppleCredentials {
            say("worker uses the Apple credentials from the environment")
        } else if let credentials = throwawayCredentials {
            workerEnvironment.merge(credentials) { _, new in new }
            say("worker signs client secrets with a throwaway key (\(directory)/AuthKey_DEVKEY0001.p8)")
        } else {
            workerEnvironment["SIWA_APPLE_CALLS"] = "disabled"
            say("no Apple credentials: worker runs with SIWA_APPLE_CALLS=disabled (no exchange, no revoke)")
        }
        if settings.startWorker {
            try spawn("worker", workerPath, environment: workerEnvironment, listeners: servesAPI ? [.workerOps, .appAPI] : [.workerOps])
        } else {
            say("--no-worker: no worker started; jobs wait in siwa.jobs")
        }

        if listen.port == 0 { listen.port = try await boundPort(of: .receiver, child: "receiver") }
        if defaultListenBusy { say("port 8080 is busy; the receiver listens on \(listen.port)") }
        if settings.startWorker && opsListen.port == 0 { opsListen.port = try await boundPort(of: .workerOps, child: "worker") }
        if servesAPI && apiListen.port == 0 { apiListen.port = try await boundPort(of: .appAPI, child: "worker") }

        let receiver = "http://\(Self.dialHost(listen.host)):\(listen.port)"
        try await waitForReady(url: receiver + "/readyz", what: "receiver")
        let appAPI = servesAPI ? "http://\(Self.dialHost(apiListen.host)):\(apiListen.port)" : nil
        if let appAPI {
            try await waitForReady(url: appAPI + "/v1/changes?limit=1", what: "app API", bearer: settings.apiToken)
        }
        let console = try await startConsole(databaseURL: databaseURL)
        return URLs(
            database: databaseURL, receiver: receiver, endpoint: receiver + settings.notificationPath,
            workerOps: "http://\(Self.dialHost(opsListen.host)):\(opsListen.port)", appAPI: appAPI, fakeApple: fakeApple,
            appleBase: appleBase, console: console, caFile: certificates?.caFile,
            webSignIn: webReturnURL.map { returnURL in
                let clientID = settings.clientIDs.split(separator: ",").first.map(String.init) ?? "com.example.app"
                return receiver + "/apple/sign-in?" + FormEncoding.encode([("client_id", clientID), ("return_to", returnURL)])
            })
    }

    /// The operator console, in this process: 127.0.0.1:9400, or a port the system picks when that
    /// is busy. Busy is learnt by binding it: a check before binding lost the port to another
    /// `siwa dev` starting at the same moment (two test processes did), which then failed to start.
    private func startConsole(databaseURL: String) async throws -> String {
        func start(port: Int) async throws -> String {
            let server = ConsoleServer(
                settings: ConsoleSettings(
                    databaseURL: databaseURL, listen: ListenAddress(host: "127.0.0.1", port: port), logLevel: settings.logLevel),
                logger: logger)
            do {
                let url = try await server.start()
                console = server
                return url
            } catch {
                server.stop()  // its database connection
                throw error
            }
        }
        do {
            return try await start(port: 9400)
        } catch let error as HTTPServerError where error.code == .addressInUse {
            return try await start(port: 0)
        }
    }

    /// `siwa fake-apple --listen 127.0.0.1:0`; returns its base URL from the
    /// `listening on http(s)://127.0.0.1:PORT` line it prints.
    private func startFakeApple(siwaPath: String, credentials: [String: String]?, tlsArguments: [String]) async throws -> String {
        let found = Locked<String?>(nil)
        let lines = Locked<[String]>([])
        let output = output
        let process = try DevProcess(
            name: "fake-apple", executable: siwaPath,
            arguments: ["fake-apple", "--listen", "127.0.0.1:0"]
                + (credentials.map {
                    ["--verify-key-file", $0["SIWA_PRIVATE_KEY_FILE"]!, "--team-id", $0["SIWA_TEAM_ID"]!]
                } ?? []) + tlsArguments,
            environment: ProcessInfo.processInfo.environment.merging(["SIWA_CLIENT_IDS": settings.clientIDs]) { $1 }
        ) { line in
            if let range = line.range(of: #"listening on (https?://[^\s"]+)"#, options: .regularExpression) {
                let url = line[range].dropFirst("listening on ".count)
                found.withLock { if $0 == nil { $0 = String(url).trimmingCharacters(in: CharacterSet(charactersIn: "/")) } }
            }
            lines.withLock { $0.append(line) }
            output.line(DevLogFormatter.format(line, prefix: "fake-apple"))
        }
        children.append(process)
        let deadline = ContinuousClock.now + .seconds(20)
        while ContinuousClock.now < deadline {
            try checkSignal()
            if let url = found.withLock({ $0 }) {
                say("fake Apple listening on \(url)")
                return url
            }
            if let status = process.status {
                try? await Task.sleep(for: .milliseconds(100))  // let the reader thread flush
                let text = lines.withLock { $0.joined(separator: " ") }
                if text.contains("unknown command") {
                    throw DevError(
                        "this build has no `siwa fake-apple`; run with --no-fake-apple or set SIWA_APPLE_BASE_URL")
                }
                throw DevError("siwa fake-apple exited with status \(status) before listening")
            }
            try await Task.sleep(for: .milliseconds(50))
        }
        throw DevError("siwa fake-apple printed no \"listening on ...\" line within 20 s")
    }

    /// Starts a child whose log lines are shown from the level asked for up, and whose `listeners`
    /// report their ports to `boundPorts`.
    private func spawn(_ name: String, _ path: String, environment: [String: String], listeners: [DevListener]) throws {
        let output = output
        let boundPorts = boundPorts
        let level = settings.logLevel
        children.append(
            try DevProcess(name: name, executable: path, arguments: [], environment: environment) { line in
                boundPorts.read(line, for: listeners)
                if let shown = DevLogFormatter.format(line, prefix: name, from: level) { output.line(shown) }
            })
    }

    /// The port `listener` bound, once its child has logged it; an error if the child ends first.
    private func boundPort(of listener: DevListener, child name: String) async throws -> Int {
        let deadline = ContinuousClock.now + .seconds(settings.readyTimeout)
        while ContinuousClock.now < deadline {
            try checkSignal()
            if let port = boundPorts.port(of: listener) { return port }
            if let dead = children.first(where: { $0.name == name && !$0.isRunning }) {
                throw DevError("\(dead.name) exited with status \(dead.status ?? -1) during start-up")
            }
            try await Task.sleep(for: .milliseconds(50))
        }
        throw DevError("the \(name) logged no \"\(listener.message)\" line within \(settings.readyTimeout) s")
    }

    /// A P-256 `.p8`, a team and key ID, and one AES-256 token key, all in the temp dir.
    private func makeThrowawayCredentials(in directory: String) throws -> [String: String] {
        let key = try P256.Signing.PrivateKey.generate()
        let keyPath = directory + "/AuthKey_DEVKEY0001.p8"
        guard FileManager.default.createFile(
            atPath: keyPath, contents: Data(key.pemRepresentation.utf8), attributes: [.posixPermissions: 0o600])
        else { throw DevError("cannot write \(keyPath)") }
        let tokenKey = Data(SecureRandom.bytes(count: 32)).base64EncodedString()
        return [
            "SIWA_TEAM_ID": "DEVTEAM000", "SIWA_KEY_ID": "DEVKEY0001", "SIWA_PRIVATE_KEY_FILE": keyPath,
            "SIWA_TOKEN_KEYS": "dev1:\(tokenKey)",
        ]
    }

    /// Polls `url` until it answers 200, a child dies, or the timeout passes.
    private func waitForReady(url: String, what: String, bearer: String? = nil) async throws {
        say("waiting for the \(what) (\(url))...")
        let deadline = ContinuousClock.now + .seconds(settings.readyTimeout)
        var lastAnswer = "no answer"
        while ContinuousClock.now < deadline {
            try checkSignal()
            if let dead = children.first(where: { !$0.isRunning }) {
                throw DevError("\(dead.name) exited with status \(dead.status ?? -1) during start-up")
            }
            if let answer = try? await CLIHTTP.call("GET", URL(string: url)!, bearer: bearer, timeout: .seconds(2)) {
                if answer.status == 200 { return }
                lastAnswer = "\(answer.status) \(answer.body)"
            }
            try await Task.sleep(for: .milliseconds(250))
        }
        throw DevError("the \(what) was not ready within \(settings.readyTimeout) s (last answer: \(lastAnswer))")
    }

    private func printURLs(_ urls: URLs) {
        output.line(DevBanner(
            urls: urls, clientID: settings.clientIDs.split(separator: ",").first.map(String.init) ?? "com.example.app",
            siwa: siwaCommand, workerStarted: settings.startWorker, deletesDatabase: cluster != nil,
            apiTokenFile: apiTokenFile).text)
    }

    /// `siwa` when the shell finds this very binary on PATH, else its full path, so the printed
    /// lines run as pasted (a fresh checkout has `.build/debug/siwa`, not `siwa`, on hand).
    private var siwaCommand: String {
        let ours = settings.binDirectory.appendingPathComponent("siwa").resolvingSymlinksInPath().path
        let path = ProcessInfo.processInfo.environment["PATH"] ?? ""
        for folder in path.split(separator: ":") {
            let candidate = URL(fileURLWithPath: String(folder)).appendingPathComponent("siwa")
            guard FileManager.default.isExecutableFile(atPath: candidate.path) else { continue }
            return candidate.resolvingSymlinksInPath().path == ours ? "siwa" : ours
        }
        return ours
    }

    // MARK: Run and stop

    private struct DevStopped: Error { var signal: String }

    private func checkSignal() throws {
        if let name = signalName.withLock({ $0 }) { throw DevStopped(signal: name) }
    }

    /// Returns the exit status: 0 for a signal, `--once` or the exit timer; 1 if a child died.
    private func waitUntilDone() async throws -> Int32 {
        if settings.once {
            say("--once: everything started and ready; stopping")
            return 0
        }
        let stopAt = settings.exitAfter.map { ContinuousClock.now + .seconds($0) }
        while true {
            if let name = signalName.withLock({ $0 }) {
                say("\(name): stopping")
                return 0
            }
            if let dead = children.first(where: { !$0.isRunning }) {
                say("\(dead.name) exited unexpectedly (status \(dead.status ?? -1)); stopping the rest")
                return 1
            }
            if let stopAt, ContinuousClock.now >= stopAt {
                say("SIWA_DEV_EXIT_AFTER reached; stopping")
                return 0
            }
            try? await Task.sleep(for: .milliseconds(100))
        }
    }

    /// Children in reverse start order (SIGTERM, 10 s, SIGKILL), then the cluster and the temp dir.
    private func stopAll() async {
        console?.stop()
        for child in children.reversed() where child.isRunning {
            let status = await child.stop(grace: .seconds(10))
            say("\(child.name) stopped (status \(status.map(String.init) ?? "?"))")
        }
        if let cluster {
            await cluster.destroy()
            say("PostgreSQL stopped and its directory removed")
        }
        if let temporaryDirectory {
            try? FileManager.default.removeItem(atPath: temporaryDirectory)
            OrphanReaper.shared?.forget(folder: temporaryDirectory)
        }
    }

    /// Where to connect for a listener bound to `host` (a wildcard listens on loopback too).
    private static func dialHost(_ host: String) -> String {
        switch host {
        case "0.0.0.0", "": return "127.0.0.1"
        case "::": return "[::1]"
        default: return host.contains(":") ? "[\(host)]" : host
        }
    }
}
