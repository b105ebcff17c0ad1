import AppleClient
import Foundation
package import JobQueue
package import Logging
package import Postgres
package import Metrics
import StoredTokens

/// The Apple-facing handlers over the worker's pool, with their counters in `metrics` when given.
package func makeAppleHandlers(
    settings: AppleSettings, pool: PostgresPool, logger: Logger, metrics: MetricsRegistry? = nil
) throws -> [any JobHandler] {
    makeAppleHandlers(context: try makeAppleJobContext(settings: settings, pool: pool, logger: logger, metrics: metrics))
}

/// The Apple-facing handlers over one shared context (the app API uses the same one).
package func makeAppleHandlers(context: AppleJobContext) -> [any JobHandler] {
    [
        ExchangeJobHandler(context: context), RevokeJobHandler(context: context), ReconcileJobHandler(context: context),
    ]
}

/// The shared state the handlers use (exposed for tests and tools).
package func makeAppleJobContext(
    settings: AppleSettings, pool: PostgresPool, logger: Logger, metrics: MetricsRegistry? = nil
) throws -> AppleJobContext {
    let signer = try ClientSecretSigner(
        teamID: settings.teamID, keyID: settings.keyID, privateKeyFile: settings.privateKeyPEMPath)
    let tokenBox = try TokenBox(configuration: settings.tokenKeys)
    let http = AppleHTTP(baseURL: settings.baseURL, timeout: settings.timeout, caCertificates: settings.caCertificates)
    let keys = AppleKeySet(http: http, logger: logger)
    var context = AppleJobContext(
        pool: pool, client: AppleAuthClient(http: http, signer: signer), tokenBox: tokenBox,
        identityVerifier: IdentityTokenVerifier(keys: keys), metrics: metrics.map(AppleMetrics.init(registry:)))
    context.pauseInterval = settings.pauseInterval
    return context
}
