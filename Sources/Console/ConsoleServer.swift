import HTTPServer
package import Logging
import Postgres
import Settings

/// `siwa console`'s server: pages over the database, read with the login `DATABASE_URL` names (a
/// login in `siwa_worker` is enough), and the operator's two actions through `JobAdministration`,
/// the same code `siwa jobs retry/cancel` runs.
package final class ConsoleServer: Sendable {
    private let settings: ConsoleSettings
    private let pool: PostgresPool
    private let server: HTTPServer
    private let logger: Logger

    package init(settings: ConsoleSettings, logger: Logger) {
        self.settings = settings
        self.logger = logger
        // Two connections: a page reads in one transaction, so one slow page leaves the other.
        pool = PostgresPool(conninfo: settings.databaseURL, size: 2, applicationName: "siwa-console", logger: logger)
        let loopback = CommonSettings.isLoopback(settings.listen.host)
        let router = ConsoleRouter(
            pool: pool, sessions: ConsoleSessions(tokens: settings.tokens, secureCookies: !loopback),
            allowedHosts: settings.requiresLogin || !loopback ? nil : Self.loopbackNames(settings.listen.host), logger: logger)
        server = HTTPServer(
            configuration: HTTPServer.Configuration(
                host: settings.listen.host, port: settings.listen.port, threadCount: 2, connectionLimit: 64,
                connectionTimeout: .seconds(30), maxBodyBytes: 16 * 1024, shutdownGracePeriod: .seconds(2),
                requestDeadline: .seconds(30)),
            logger: logger, asyncRespond: { await router.respond($0) })
    }

    /// Checks the database (reachable, migrated, readable by this login), then listens. Returns the
    /// console's URL, `http://HOST:PORT/`.
    package func start() async throws -> String {
        do {
            _ = try await pool.withConnection { try await $0.query("SELECT siwa.console_can_read()").count }
        } catch {
            pool.close()
            throw ConsoleError(message: "cannot read the database (DATABASE_URL; migrated? readable by this login?): "
                + (String(describing: error).split(separator: "\n").first.map(String.init) ?? ""))
        }
        try server.start()
        let host = settings.listen.host.contains(":") ? "[\(settings.listen.host)]" : settings.listen.host
        return "http://\(host):\(server.port)/"
    }

    /// Stops listening (in-flight pages get a moment) and closes the connections.
    package func stop() {
        server.stop()
        pool.close()
    }

    /// A loopback listener answers to its own address and the usual loopback names.
    private static func loopbackNames(_ host: String) -> Set<String> {
        let bracketed = host.contains(":") && !host.hasPrefix("[") ? "[\(host)]" : host
        return ["127.0.0.1", "localhost", "[::1]", bracketed.lowercased()]
    }
}

package struct ConsoleError: Error, CustomStringConvertible {
    package var message: String
    package var description: String { message }
}
