internal import Dispatch
internal import HTTPServer
import Logging
import Postgres
import Settings
import Metrics

/// The worker's ops listener (`SIWA_OPS_LISTEN`): `/healthz` (the process answers), `/readyz` (the
/// database answers a `SELECT 1`) and `/metrics` (the registry every part of the worker counts in).
/// GET only; anything else is a JSON error.
final class OpsServer: Sendable {
    private let server: HTTPServer

    init(listen: ListenAddress, pool: PostgresPool, registry: MetricsRegistry, logger: Logger) {
        server = HTTPServer(
            configuration: .init(
                host: listen.host, port: listen.port, threadCount: 1,
                connectionLimit: 64, connectionTimeout: .seconds(10), maxBodyBytes: 1024,
                shutdownGracePeriod: .seconds(1)),
            logger: logger,
            asyncRespond: { request in
                guard request.method == "GET" else { return .json(status: 405, #"{"error":"method_not_allowed"}"#) }
                switch request.path {
                case "/healthz": return .json(#"{"status":"ok"}"#)
                case "/readyz":
                    let ready = (try? await pool.withConnection { try await $0.query("SELECT 1") }) != nil
                    return ready ? .json(#"{"status":"ready"}"#) : .json(status: 503, #"{"error":"database_unreachable"}"#)
                case "/metrics":
                    return HTTPResponse(
                        status: 200, headers: [("Content-Type", "text/plain; version=0.0.4")],
                        body: Array(registry.render().utf8))
                default: return .json(status: 404, #"{"error":"not_found"}"#)
                }
            })
    }

    /// The bound port (useful with port 0).
    var port: Int { server.port }

    func start() throws { try server.start() }

    /// Stops listening, off the caller's thread (the HTTP layer's stop blocks while it drains).
    func stop() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            DispatchQueue.global().async {
                self.server.stop()
                continuation.resume()
            }
        }
    }
}
