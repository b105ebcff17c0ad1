import CryptoCore
import Foundation
import HTTPServer
import JOSE
import OutboundHTTP
import TestTiming

/// Stands in for Apple's key endpoint (`/auth/keys`) and signs notifications the way Apple does.
/// Its key set can be changed mid-test (rotation) and the endpoint taken down (outage).
final class TestAppleKeys: Sendable {
    let signingKey: RSA.PrivateKey
    let keyID: String
    private let server: HTTPServer
    private let state = LockedBox<(keys: [(String, RSA.PublicKey)], up: Bool, fetches: Int)>(([], true, 0))

    init(keyID: String = "test-key-1") throws {
        signingKey = try RSA.PrivateKey.generate(bits: 2048)
        self.keyID = keyID
        let state = self.state
        state.value.keys = [(keyID, signingKey.publicKey)]
        server = HTTPServer(
            configuration: .init(host: "127.0.0.1", port: 0, threadCount: 1),
            handler: ClosureHTTPHandler(synchronous: { request in
                guard request.path == "/auth/keys" else { return .json(status: 404, "{}") }
                let (keys, up) = state.withValue { value -> ([(String, RSA.PublicKey)], Bool) in
                    value.fetches += 1
                    return (value.keys, value.up)
                }
                guard up else { return .json(status: 503, #"{"error":"down"}"#) }
                let set = JSONWebKeySet(keys: keys.map { JSONWebKey(rs256: $0.1, keyID: $0.0) })
                return HTTPResponse(status: 200, headers: [("Content-Type", "application/json")], body: set.jsonBytes())
            }))
        try server.start()
    }

    var baseURL: String { "http://127.0.0.1:\(server.port)" }
    var fetchCount: Int { state.withValue { $0.fetches } }

    func setUp(_ up: Bool) { state.withValue { $0.up = up } }
    func publish(_ keys: [(String, RSA.PublicKey)]) { state.withValue { $0.keys = keys } }

    func stop() { server.stop() }

    /// A compact JWS over `claims`, RS256 with this key (or another key / header, for forgeries).
    func sign(_ claims: [String: Any], keyID: String? = nil, with key: RSA.PrivateKey? = nil) throws -> String {
        let payload = try JSONSerialization.data(withJSONObject: claims, options: [.sortedKeys])
        return try JWTSigner.rs256(payload: Array(payload), keyID: keyID ?? self.keyID, privateKey: key ?? signingKey)
    }

    /// Claims shaped like a real notification: events as a JSON string, event_time in milliseconds.
    static func claims(
        type: String = "consent-revoked", sub: String = "000123.abc.0001", audience: String = "com.example.app",
        jti: String = UUID().uuidString, eventTime: Date = Date(), expires: Date? = Date().addingTimeInterval(86400),
        email: String? = nil, issuer: String = "https://appleid.apple.com"
    ) -> [String: Any] {
        var event: [String: Any] = ["type": type, "sub": sub, "event_time": Int64(eventTime.timeIntervalSince1970 * 1000)]
        if let email {
            event["email"] = email
            event["is_private_email"] = "true"
        }
        let eventJSON = String(decoding: try! JSONSerialization.data(withJSONObject: event, options: [.sortedKeys]), as: UTF8.self)
        var claims: [String: Any] = [
            "iss": issuer, "aud": audience, "iat": Int(Date().timeIntervalSince1970), "jti": jti, "events": eventJSON,
        ]
        if let expires { claims["exp"] = Int(expires.timeIntervalSince1970) }
        return claims
    }

    static func body(_ jws: String) -> Data { Data(#"{"payload":"\#(jws)"}"#.utf8) }
}

/// A value behind a lock, for test fixtures shared with server threads.
final class LockedBox<Value>: @unchecked Sendable {
    // @unchecked: every access goes through `lock`.
    private let lock = NSLock()
    var value: Value {
        get { lock.lock(); defer { lock.unlock() }; return stored }
        set { lock.lock(); defer { lock.unlock() }; stored = newValue }
    }
    private var stored: Value
    init(_ value: Value) { stored = value }
    @discardableResult
    func withValue<T>(_ body: (inout Value) -> T) -> T {
        lock.lock()
        defer { lock.unlock() }
        return body(&stored)
    }
}

/// Small HTTP helper for driving a receiver. Trusts the tests' CA (`TestCertificates.authority`)
/// besides the system's, so a fake Apple or sink a test runs over `https://` answers it too.
enum HTTP {
    static let client = HTTPClient(extraCertificatesPEM: TestCertificates.authority.certificatePEM)

    static func request(_ method: String, _ url: String, body: Data? = nil, bearer: String? = nil, timeout: Duration = .seconds(15))
        async throws -> (status: Int, body: String)
    {
        var headers: [(String, String)] = []
        if body != nil { headers.append(("Content-Type", "application/json")) }
        if let bearer { headers.append(("Authorization", "Bearer \(bearer)")) }
        let response = try await client.send(
            HTTPRequest(
                method: method, url: url, headers: headers, body: Array(body ?? Data()), timeout: TestTimeScale.scaled(timeout)))
        return (response.status, String(decoding: response.body, as: UTF8.self))
    }
}
