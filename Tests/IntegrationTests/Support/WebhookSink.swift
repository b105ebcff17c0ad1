import CryptoCore
import Foundation
import HTTPServer
import Locking
import TestTiming

/// A receiver for webhook tests: records every request, checks its Standard Webhooks signature with
/// a verifier of its own (below: HMAC built from SHA-256 by hand, not the worker's signer), and
/// answers as the test says (200, 500, a redirect, slowly, ...).
final class WebhookSink: Sendable {
    struct Received: Sendable {
        var path: String
        var webhookID: String?
        var timestamp: String?
        var body: String
        var verified: Bool
        /// The change id in the body (`id`), and its account.
        var changeID: Int64?
        var sub: String?
        /// What the sink answered (after its delay, if any).
        var status: Int
        /// Positions on one clock of arrivals and answers: a request that arrived after another was
        /// answered has `arrivedAt` > the other's `answeredAt`.
        var arrivedAt = 0
        var answeredAt = 0
    }

    /// What to answer to one request; `attempt` counts earlier requests with the same webhook-id.
    struct Answer: Sendable {
        var status: Int = 200
        var delay: Duration = .zero
        var headers: [(name: String, value: String)] = []
        /// Held (unanswered) while the sink's gate is closed, at most 30 s.
        var held = false

        static let ok = Answer()
        static func status(_ status: Int) -> Answer { Answer(status: status) }
    }

    typealias Behaviour = @Sendable (_ request: Received, _ attempt: Int) -> Answer

    let secret: String
    private let server: HTTPServer
    private let state: Locked<(received: [Received], attempts: [String: Int], behaviour: Behaviour)>
    /// Requests that arrived, answered or not yet (a slow answer is still pending).
    private let arrivals = Locked<[Received]>([])
    private let clock = Locked(0)
    private let gateClosed = Locked(true)

    init(secret: String, port: Int = 0, behaviour: @escaping Behaviour = { _, _ in .ok }) throws {
        self.secret = secret
        let state = Locked<(received: [Received], attempts: [String: Int], behaviour: Behaviour)>(([], [:], behaviour))
        self.state = state
        let arrivals = arrivals
        let clock = clock
        let gateClosed = gateClosed
        server = HTTPServer(
            // No grace at stop: a test's sink may hold a deliberately slow answer, and stop() runs on
            // the test's thread.
            configuration: .init(
                host: "127.0.0.1", port: port, threadCount: 2, connectionTimeout: .seconds(30), shutdownGracePeriod: .zero),
            asyncRespond: { request in
                let object = (try? JSONSerialization.jsonObject(with: Data(request.body))) as? [String: Any]
                var received = Received(
                    path: request.path, webhookID: request.header("webhook-id"), timestamp: request.header("webhook-timestamp"),
                    body: request.bodyText,
                    verified: IndependentWebhookVerifier.verify(
                        secret: secret, id: request.header("webhook-id"), timestamp: request.header("webhook-timestamp"),
                        body: request.body, signatures: request.header("webhook-signature"),
                        now: Int64(Date().timeIntervalSince1970)),
                    changeID: (object?["id"] as? NSNumber)?.int64Value, sub: object?["sub"] as? String, status: 0)
                received.arrivedAt = clock.withLock { $0 += 1; return $0 }
                arrivals.withLock { $0.append(received) }
                let answer = state.withLock { state -> Answer in
                    let key = received.webhookID ?? ""
                    let attempt = state.attempts[key, default: 0]
                    state.attempts[key] = attempt + 1
                    return state.behaviour(received, attempt)
                }
                // A client that gives up while the answer is slow or held closes its connection,
                // and the server then cancels this task (Sources/HTTPServer/README.md): the answer
                // reaches nobody, so it is not recorded as answered.
                let holdUntil = ContinuousClock.now + TestTimeScale.scaled(.seconds(30))
                do {
                    if answer.delay > .zero { try await Task.sleep(for: answer.delay) }
                    while answer.held, gateClosed.withLock({ $0 }), ContinuousClock.now < holdUntil {
                        try await Task.sleep(for: .milliseconds(20))
                    }
                } catch {
                    return HTTPResponse(status: 499)
                }
                received.status = answer.status
                received.answeredAt = clock.withLock { $0 += 1; return $0 }
                state.withLock { $0.received.append(received) }
                return HTTPResponse(status: answer.status, headers: answer.headers, body: Array(#"{"ok":true}"#.utf8))
            })
        try server.start()
    }

    var port: Int { server.port }
    var url: String { "http://127.0.0.1:\(server.port)/hooks/siwa" }

    func answer(_ behaviour: @escaping Behaviour) { state.withLock { $0.behaviour = behaviour } }

    /// Lets held answers go (see `Answer.held`).
    func openGate() { gateClosed.withLock { $0 = false } }

    /// Every request, in the order their answers were sent.
    var received: [Received] { state.withLock { $0.received } }

    /// Every request that arrived, in arrival order (answered or not).
    var arrived: [Received] { arrivals.withLock { $0 } }

    /// Requests answered 2xx, in answer order.
    var delivered: [Received] { received.filter { (200...299).contains($0.status) } }

    func stop() { server.stop() }

    /// The first 2xx answer of each change, in answer order (a change answered twice appears once).
    var firstDeliveries: [Received] {
        var seen = Set<Int64>()
        return delivered.filter { $0.changeID.map { seen.insert($0).inserted } ?? false }
    }

    /// Waits (bounded) until `condition` holds for what was received.
    func waitUntil(
        timeout: Duration = .seconds(60), _ what: String = #function, _ condition: ([Received]) -> Bool
    ) async throws {
        try await TestTiming.waitUntil(
            what, timeout: timeout, detail: "received \(received.map { "\($0.changeID ?? -1)/\($0.status)" })"
        ) { condition(received) }
    }
}

/// Standard Webhooks verification written apart from the worker's signer: HMAC-SHA256 composed
/// from SHA-256 (RFC 2104), the key from `whsec_` + base64, a 5-minute timestamp tolerance, and any
/// of the space-separated `v1,` signatures.
enum IndependentWebhookVerifier {
    static func hmacSHA256(key: [UInt8], message: [UInt8]) -> [UInt8] {
        var block = key.count > 64 ? SHA256.hash(key) : key
        block += [UInt8](repeating: 0, count: 64 - block.count)
        let inner = SHA256.hash(block.map { $0 ^ 0x36 } + message)
        return SHA256.hash(block.map { $0 ^ 0x5C } + inner)
    }

    static func verify(
        secret: String, id: String?, timestamp: String?, body: [UInt8], signatures: String?, now: Int64
    ) -> Bool {
        guard secret.hasPrefix("whsec_"), let key = Data(base64Encoded: String(secret.dropFirst(6))),
            let id, let timestamp, let seconds = Int64(timestamp), abs(now - seconds) <= 300, let signatures
        else { return false }
        let expected = Data(hmacSHA256(key: Array(key), message: Array("\(id).\(timestamp).".utf8) + body))
            .base64EncodedString()
        return signatures.split(separator: " ").contains { candidate in
            guard candidate.hasPrefix("v1,") else { return false }
            let given = Array(candidate.dropFirst(3).utf8)
            let wanted = Array(expected.utf8)
            guard given.count == wanted.count else { return false }
            return zip(given, wanted).reduce(UInt8(0)) { $0 | ($1.0 ^ $1.1) } == 0
        }
    }
}
