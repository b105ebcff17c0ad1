import CryptoCore
import HTTPServer
import ReceiverCore
import Synchronization
import Testing
import Metrics
import SiwaModel

/// A store that answers every submit as the test says and records what reached it: the
/// handler's side of the seam (the real store's commits are tested against PostgreSQL).
final class ScriptedStore: NotificationStoring {
    private let answer: NotificationStore.Outcome
    private let ready: Bool
    private let pending: Int
    private let seen = Mutex<(submitted: [String], counted: [String])>(([], []))

    init(answering answer: NotificationStore.Outcome, ready: Bool = true, pending: Int = 0) {
        self.answer = answer
        self.ready = ready
        self.pending = pending
    }

    func submit(_ notification: VerifiedNotification, respond: @escaping @Sendable (NotificationStore.Outcome) -> Void) {
        seen.withLock { $0.submitted.append(notification.notification.jti) }
        respond(answer)
    }

    func countRejection(_ rejection: Rejection) { seen.withLock { $0.counted.append(rejection.code) } }
    var isReady: Bool { ready }
    var pendingCount: Int { pending }
    var submitted: [String] { seen.withLock { $0.submitted } }
    var counted: [String] { seen.withLock { $0.counted } }
}

/// The receiver's handler over a scripted store: every answer the store can give becomes the
/// contract's HTTP answer, and nothing the verifier refused reaches the store.
@Suite struct ReceiverHandlerStoreTests {
    static func handler(_ store: ScriptedStore) -> ReceiverHandler<ScriptedStore> {
        ReceiverHandler(
            notificationPath: "/apple/notifications",
            verifier: NotificationVerifier(
                clientIDs: ["com.example.app"], keys: ReceiverInProcessTests.keys, now: { ReceiverInProcessTests.now }),
            store: store, keys: ReceiverInProcessTests.keys, metrics: MetricsRegistry(), logger: ReceiverInProcessTests.logger)
    }

    static func send(
        _ handler: ReceiverHandler<ScriptedStore>, _ method: String = "POST", _ path: String = "/apple/notifications",
        _ body: [UInt8] = ReceiverInProcessTests.body()
    ) async -> HTTPResponse {
        await withCheckedContinuation { continuation in
            handler.handle(HTTPRequest(method: method, path: path, query: [:], headers: [:], body: body, remoteAddress: nil)) {
                continuation.resume(returning: $0)
            }
        }
    }

    @Test func storedIsTwoHundredWithItsRequestID() async {
        let store = ScriptedStore(answering: .stored)
        let response = await Self.send(Self.handler(store))
        #expect(response.status == 200 && String(decoding: response.body, as: UTF8.self) == #"{"status":"stored"}"#)
        #expect(response.header("X-Request-Id") != nil)
        #expect(store.submitted == ["j1"])
    }

    @Test(arguments: [
        Rejection.databaseUnavailable, .databaseTimeout, .overloaded, .shuttingDown, .claimsNotStorable,
    ])
    func everyRefusalOfTheStoreIsItsOwnAnswer(_ rejection: Rejection) async {
        let store = ScriptedStore(answering: .rejected(rejection))
        let response = await Self.send(Self.handler(store))
        #expect(response.status == rejection.status)
        #expect(String(decoding: response.body, as: UTF8.self) == #"{"error":"\#(rejection.code)"}"#)
        #expect(response.header("X-Request-Id") != nil)
        // Only the request's own faults (400) are counted for `siwa status`; ours (503) are not.
        #expect(store.counted == (rejection.status == 400 ? [rejection.code] : []))
    }

    @Test func whatTheVerifierRefusesNeverReachesTheStore() async throws {
        let store = ScriptedStore(answering: .stored)
        let handler = Self.handler(store)
        let forged = ReceiverInProcessTests.body(key: try RSA.PrivateKey.generate())
        #expect(await Self.send(handler, "POST", "/apple/notifications", forged).status == 401)
        #expect(await Self.send(handler, "POST", "/apple/notifications", Array("x".utf8)).status == 400)
        #expect(store.submitted.isEmpty)
        #expect(store.counted == ["bad_signature", "body_not_json"])
    }

    @Test func readinessAndBacklogAreTheStores() async {
        let ready = Self.handler(ScriptedStore(answering: .stored, ready: true, pending: 7))
        #expect(await Self.send(ready, "GET", "/readyz").status == 200)
        let metrics = String(decoding: await Self.send(ready, "GET", "/metrics").body, as: UTF8.self)
        #expect(metrics.contains("siwa_receiver_pending_commits 7"), "\(metrics)")
        let down = Self.handler(ScriptedStore(answering: .stored, ready: false))
        let answer = await Self.send(down, "GET", "/readyz")
        #expect(answer.status == 503 && String(decoding: answer.body, as: UTF8.self) == #"{"database":false,"keys":true}"#)
    }
}
