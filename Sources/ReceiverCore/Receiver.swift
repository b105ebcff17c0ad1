import AppleClient
import Foundation
import HTTPServer
package import Logging
package import Metrics
import Lifecycle
import Locking
import Postgres
import Settings

/// The running receiver: Apple's key set, the group-commit store, and the HTTP listener.
package final class Receiver: Service {
    package let configuration: ReceiverConfiguration
    package let metrics = MetricsRegistry()
    private let logger: Logger
    private let keys: AppleKeySet
    private let store: NotificationStore
    private let server: HTTPServer
    /// The web sign-in's connections (nil when it is not served).
    private let webSignInPool: PostgresPool?

    package init(configuration: ReceiverConfiguration, logger: Logger) {
        self.configuration = configuration
        self.logger = logger
        let http = AppleHTTP(baseURL: configuration.appleBaseURL, timeout: .seconds(5), caCertificates: configuration.caCertificates)
        keys = AppleKeySet(
            http: http, logger: logger, minimumRefetchInterval: .seconds(configuration.keyRefetchInterval),
            metrics: .init(
                refreshes: metrics.counter("siwa_receiver_jwks_refreshes_total", help: "Fetches of Apple's key set."),
                failures: metrics.counter(
                    "siwa_receiver_jwks_refresh_failures_total", help: "Failed fetches of Apple's key set.")))
        var storeOptions = NotificationStore.Options()
        storeOptions.committers = configuration.databaseConnections
        storeOptions.maxPending = configuration.maxPending
        storeOptions.commitTimeout = configuration.commitTimeout
        store = NotificationStore(
            conninfo: configuration.databaseURL, options: storeOptions, logger: logger,
            metrics: .init(
                commitSeconds: metrics.histogram(
                    "siwa_receiver_commit_seconds", help: "Time from a batch's INSERT to its COMMIT."),
                waitSeconds: metrics.histogram(
                    "siwa_receiver_commit_wait_seconds",
                    help: "Time a verified notification waited for the commit that carries it.",
                    buckets: Histogram.requestBuckets),
                batchSize: metrics.histogram(
                    "siwa_receiver_commit_batch_size", help: "Notifications per group commit.",
                    buckets: [1, 2, 4, 8, 16, 32, 64, 128, 256]),
                duplicates: metrics.counter(
                    "siwa_receiver_duplicates_total", help: "Verified notifications whose jti was already stored."),
                stored: metrics.counter("siwa_receiver_stored_total", help: "Notifications newly stored."),
                failures: metrics.counter(
                    "siwa_receiver_commit_failures_total",
                    help: "Commits that failed for a reason other than the rows (answered 503).")))
        var webSignIn: WebSignIn?
        let listeningPort = ListeningPort()
        if let settings = configuration.webSignIn {
            let pool = PostgresPool(
                conninfo: configuration.databaseURL, size: 2, acquireTimeout: configuration.commitTimeout,
                applicationName: "siwa-receiver-web", logger: logger)
            webSignInPool = pool
            webSignIn = WebSignIn(
                settings: settings, listeningPort: { listeningPort.port }, clientIDs: configuration.clientIDs,
                appleBaseURL: configuration.appleBaseURL, pool: pool, timeout: configuration.commitTimeout, metrics: metrics,
                logger: logger)
        } else {
            webSignInPool = nil
        }
        let handler = ReceiverHandler(
            notificationPath: configuration.notificationPath,
            verifier: NotificationVerifier(clientIDs: configuration.clientIDs, keys: keys),
            store: store, keys: keys, metrics: metrics, logger: logger, webSignIn: webSignIn)
        server = HTTPServer(
            configuration: .init(
                host: configuration.listen.host, port: configuration.listen.port,
                threadCount: configuration.httpThreads, connectionLimit: configuration.connectionLimit,
                perIPConnectionLimit: configuration.perAddressLimit, connectionTimeout: .seconds(configuration.connectionTimeout), maxBodyBytes: 64 * 1024,
                requestDeadline: configuration.requestTimeout),
            handler: handler, logger: logger)
        listeningPort.attach(server)
    }

    package var port: Int { server.port }

    /// Runs until cancelled (the executable cancels it on SIGTERM/SIGINT): then stops accepting,
    /// finishes in-flight commits, and returns.
    package func run() async throws {
        store.start()
        try server.start()
        logger.info(
            "siwa-receiver listening",
            metadata: [
                "listen": "\(configuration.listen.host):\(server.port)", "path": .string(configuration.notificationPath),
                "client_ids": .string(configuration.clientIDs.joined(separator: ",")),
            ])
        if let settings = configuration.webSignIn?.resolved(listeningPort: server.port) {
            logger.info(
                "siwa-receiver serves web sign-in",
                metadata: [
                    "start": .string(settings.publicURL + WebSignIn.startPath), "redirect_uri": .string(settings.redirectURI),
                    "return_urls": .int(settings.returnURLs.count),
                ])
        }
        await withTaskGroup(of: Void.self) { group in
            group.addTask { [keys] in await keys.run() }
            await Termination.untilCancelled()
            logger.info("siwa-receiver stopping")
            server.stop()
            store.stop()
            webSignInPool?.close()
            group.cancelAll()
        }
        logger.info("siwa-receiver stopped")
    }
}

/// The server's port for its own handler, which is made before the server is. Weak: the server
/// holds the handler that holds this. The first port read is kept, so that a request still in
/// flight while the server stops (its port then reads 0) is answered with the same URL.
final class ListeningPort: Sendable {
    private struct State {
        weak var server: HTTPServer?
        var port = 0
    }

    private let state = Locked(State())

    func attach(_ server: HTTPServer) { state.withLock { $0.server = server } }

    var port: Int {
        state.withLock { state in
            if state.port == 0 { state.port = state.server?.port ?? 0 }
            return state.port
        }
    }
}
