package import AppleClient
import Foundation
package import HTTPServer
package import Logging
import Synchronization
package import Metrics
import SiwaModel

/// Routes the receiver's one listener: the notification POST, `/healthz`, `/readyz`, `/metrics`.
/// Every answer the contract names is decided here, in one place. Generic over its store, so tests
/// drive it with one of their own and the running receiver calls `NotificationStore` directly.
package struct ReceiverHandler<Store: NotificationStoring>: HTTPHandler {
    private let notificationPath: String
    private let verifier: NotificationVerifier
    private let store: Store
    private let keys: AppleKeySet
    private let metrics: MetricsRegistry
    private let logger: Logger
    private let responses: [String: Counter]
    private let verifySeconds: Histogram
    private let answerSeconds: Histogram
    private let received: Counter
    private let webSignIn: WebSignIn?

    package init(
        notificationPath: String, verifier: NotificationVerifier, store: Store, keys: AppleKeySet,
        metrics: MetricsRegistry, logger: Logger, webSignIn: WebSignIn? = nil
    ) {
        self.webSignIn = webSignIn
        self.notificationPath = notificationPath
        self.verifier = verifier
        self.store = store
        self.keys = keys
        self.metrics = metrics
        self.logger = logger
        // Series are fixed up front: the reason label comes from a closed set.
        var responses: [String: Counter] = [:]
        let help = "Notification requests answered, by status and reason."
        responses["200 stored"] = metrics.counter(
            "siwa_receiver_requests_total", help: help, labels: ["status": "200", "reason": "stored"])
        for rejection in Rejection.allCodes + [
            Rejection(status: 404, code: "not_found"), Rejection(status: 405, code: "method_not_allowed"),
        ] {
            responses["\(rejection.status) \(rejection.code)"] = metrics.counter(
                "siwa_receiver_requests_total", help: help,
                labels: ["status": String(rejection.status), "reason": rejection.code])
        }
        self.responses = responses
        self.verifySeconds = metrics.histogram(
            "siwa_receiver_verify_seconds", help: "Time to parse and verify a notification's JWS.")
        self.answerSeconds = metrics.histogram(
            "siwa_receiver_request_seconds",
            help: "Time from a notification POST's complete body to its answer (verification, queueing, commit).",
            buckets: Histogram.requestBuckets)
        self.received = metrics.counter("siwa_receiver_received_total", help: "Notification POSTs received.")
        metrics.gauge("siwa_receiver_pending_commits", help: "Verified notifications waiting for a commit.") {
            [store] in Double(store.pendingCount)
        }
        metrics.gauge("siwa_receiver_ready", help: "1 when /readyz would answer 200 (database and keys), else 0.") {
            [store, keys] in store.isReady && keys.hasKeys ? 1 : 0
        }
        metrics.gauge("siwa_receiver_jwks_age_seconds", help: "Seconds since Apple's key set was last fetched.") {
            [keys] in keys.age ?? -1
        }
    }

    package func handle(_ request: HTTPRequest, respond: @escaping @Sendable (HTTPResponse) -> Void) {
        if let webSignIn, webSignIn.handle(request, respond: respond) { return }
        switch (request.method, request.path) {
        case ("POST", notificationPath):
            receive(request, respond: respond)
        case (_, notificationPath):
            respond(reject(Rejection(status: 405, code: "method_not_allowed"), extraHeaders: [("Allow", "POST")]))
        case ("GET", "/healthz"):
            respond(.json(#"{"status":"ok"}"#))
        case ("GET", "/readyz"):
            let database = store.isReady
            let keysKnown = keys.hasKeys
            let body = #"{"database":\#(database),"keys":\#(keysKnown)}"#
            respond(.json(status: database && keysKnown ? 200 : 503, body))
        case ("GET", "/metrics"):
            respond(HTTPResponse(
                status: 200, headers: [("Content-Type", "text/plain; version=0.0.4; charset=utf-8")],
                body: Array(metrics.render().utf8)))
        default:
            respond(reject(Rejection(status: 404, code: "not_found")))
        }
    }

    private func receive(_ request: HTTPRequest, respond answer: @escaping @Sendable (HTTPResponse) -> Void) {
        received.increment()
        let requestID = RequestID.next()
        let started = ContinuousClock.now
        let answerSeconds = answerSeconds
        let respond: @Sendable (HTTPResponse) -> Void = { response in
            answerSeconds.observe((ContinuousClock.now - started).seconds)
            answer(response)
        }
        switch verifier.verifyCached(body: request.body) {
        case .verified(let verified):
            verifySeconds.observe((ContinuousClock.now - started).seconds)
            commit(verified, requestID: requestID, respond: respond)
        case .rejected(let rejection):
            respond(reject(rejection, requestID: requestID))
        case .needsKey:
            // An unseen kid: fetch Apple's keys off the server's threads, then carry on.
            Task { [self] in
                switch await verifier.verify(body: request.body) {
                case .success(let verified): commit(verified, requestID: requestID, respond: respond)
                case .failure(let rejection): respond(reject(rejection, requestID: requestID))
                }
            }
        }
    }

    private func commit(
        _ verified: VerifiedNotification, requestID: String, respond: @escaping @Sendable (HTTPResponse) -> Void
    ) {
        let responses = responses
        store.submit(verified) { [self] outcome in
            switch outcome {
            case .stored:
                responses["200 stored"]?.increment()
                logger.debug(
                    "notification stored",
                    metadata: [
                        "request_id": .string(requestID), "jti": .string(verified.notification.jti),
                        "client_id": .string(verified.clientID), "event": .string(verified.notification.event.type.rawValue),
                    ])
                var response = HTTPResponse.json(#"{"status":"stored"}"#)
                response.headers.append(("X-Request-Id", requestID))
                respond(response)
            case .rejected(let rejection):
                respond(reject(rejection, requestID: requestID))
            }
        }
    }

    private func reject(
        _ rejection: Rejection, requestID: String? = nil, extraHeaders: [(name: String, value: String)] = []
    ) -> HTTPResponse {
        responses["\(rejection.status) \(rejection.code)"]?.increment()
        if rejection.status == 400 || rejection.status == 401 { store.countRejection(rejection) }
        var metadata: Logger.Metadata = ["http.status": .int(rejection.status), "reason": .string(rejection.code)]
        if let requestID { metadata["request_id"] = .string(requestID) }
        if rejection.status >= 500 {
            logger.warning("notification refused", metadata: metadata)
        } else {
            logger.debug("notification refused", metadata: metadata)
        }
        var response = HTTPResponse.json(status: rejection.status, #"{"error":"\#(rejection.code)"}"#)
        response.headers += extraHeaders
        if let requestID { response.headers.append(("X-Request-Id", requestID)) }
        return response
    }
}

/// Request IDs for logs and the `X-Request-Id` header: a per-process random prefix and a counter,
/// unique across receivers without coordination and cheap enough for every request.
enum RequestID {
    private static let prefix = String(UInt32.random(in: 0...UInt32.max), radix: 16)
    private static let counter = Atomic<UInt64>(0)

    static func next() -> String {
        let number = counter.wrappingAdd(1, ordering: .relaxed).newValue
        return prefix + "-" + String(number, radix: 16)
    }
}
