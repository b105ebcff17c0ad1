import AppleClient
import Foundation
import Locking
import OutboundHTTP
import Settings
import Metrics

/// `siwa simulate sign-in --client-id ID --sub SUB [--api-url URL] [--api-token T]
/// [--fake-apple-url URL] [--email E] [--no-code]`: a whole Sign in with Apple sign-in against the app
/// API, with the fake Apple standing in for the device's Apple ID sheet:
///   1. `POST {api}/v1/nonces` → the raw nonce;
///   2. its SHA-256 hex goes to the fake Apple (`POST /fake/identity-tokens`), as an app hands it to
///      Apple, which answers an identity token carrying it and an authorization code;
///   3. `POST {api}/v1/sign-in` with the token, the raw nonce and the code; the answer is printed.
/// Exit 0 on 200, 1 otherwise.
///
/// Load, for benchmarks: `--count N --concurrency C` runs N sign-ins (sub `SUB-<i>`), C at a time,
/// and prints sign-ins per second and the sign-in request's p50/p99 instead of each answer.
enum SimulateSignIn {
    struct Request {
        var clientID: String
        var sub: String
        var email: String?
        var withCode: Bool
        var apiURL: URL
        var apiToken: String
        var fakeAppleURL: URL
        var count: Int
        var concurrency: Int
        /// `SIWA_CA_FILE`, for an API or a fake Apple served over `https://` with a private CA.
        var caCertificates: String?
    }

    static func run(_ source: ConfigurationSource) async -> Int32 {
        let request: Request
        do {
            request = try parse(source.withoutEnvironment(), environment: source)
        } catch {
            FileHandle.standardError.write(Data("siwa simulate sign-in: \(error)\n".utf8))
            return 2
        }
        if request.count == 1 {
            do {
                let client = HTTPClient(extraCertificatesPEM: request.caCertificates)
                let (status, body, _) = try await signIn(request, sub: request.sub, client: client)
                print("\(status) \(body)")
                return status == 200 ? 0 : 1
            } catch {
                FileHandle.standardError.write(Data("siwa simulate sign-in: \(error)\n".utf8))
                return 1
            }
        }
        return await load(request)
    }

    static let options = ["CLIENT_ID", "SUB", "EMAIL", "API_URL", "API_TOKEN", "FAKE_APPLE_URL", "COUNT", "CONCURRENCY"]

    /// The variable `siwa dev` prints for a URL flag.
    private static func fallbackVariable(_ flag: String) -> String {
        flag == "API_URL" ? "SIWA_APP_API_URL" : "SIWA_APPLE_BASE_URL"
    }

    private static func parse(_ flags: ConfigurationSource, environment: ConfigurationSource) throws -> Request {
        try flags.rejectUnknownFlags(options)
        func url(_ name: String, _ fallback: String) throws -> URL {
            let text = try flags.string(name) ?? environment.string(fallbackVariable(name)) ?? fallback
            guard let url = URL(string: text.hasSuffix("/") ? String(text.dropLast()) : text), url.host != nil else {
                throw ConfigurationError(variable: "--\(ConfigurationSource.flagName(for: name))", problem: "not a URL")
            }
            return url
        }
        // The token may come from SIWA_APP_API_TOKENS (its first) so it need not be typed.
        let token = try flags.string("API_TOKEN") ?? environment.list("SIWA_APP_API_TOKENS")?.first
        guard let token else {
            throw ConfigurationError(variable: "--api-token", problem: "is required (a token of SIWA_APP_API_TOKENS)")
        }
        return Request(
            clientID: try flags.require("CLIENT_ID"), sub: try flags.require("SUB"), email: try flags.string("EMAIL"),
            withCode: !flags.isSet(switch: "no-code"), apiURL: try url("API_URL", "http://127.0.0.1:8081"), apiToken: token,
            fakeAppleURL: try url("FAKE_APPLE_URL", "http://127.0.0.1:9443"),
            count: try flags.integer("COUNT", default: 1, range: 1...10_000_000),
            concurrency: try flags.integer("CONCURRENCY", default: 1, range: 1...1024),
            caCertificates: try CommonSettings.caCertificates(environment))
    }

    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    /// The three requests of one sign-in: `next` takes the answer
    /// to the previous request (nil at first) and gives the next request, or nil when done; then
    /// `result` holds the sign-in's answer.
    struct Flow {
        enum Target { case api, fakeApple }
        struct Outgoing {
            var target: Target
            var path: String
            var json: [String: Any]
            var bearer: String?
        }

        let request: Request
        let sub: String
        private var nonce: String?
        private var signInStarted: ContinuousClock.Instant?
        private(set) var result: (status: Int, body: String, took: Duration)?

        init(_ request: Request, sub: String) {
            self.request = request
            self.sub = sub
        }

        mutating func next(after answer: (status: Int, body: String)?) throws -> Outgoing? {
            guard let answer else { return Outgoing(target: .api, path: "v1/nonces", json: [:], bearer: request.apiToken) }
            guard let nonce else {
                guard answer.status == 201, let nonce = object(answer.body)?["nonce"] as? String else {
                    throw Failure(description: "POST \(request.apiURL)/v1/nonces answered \(answer.status) \(answer.body)")
                }
                self.nonce = nonce
                var apple: [String: Any] = [
                    "client_id": request.clientID, "sub": sub, "nonce": IdentityTokenVerifier.nonceClaim(rawNonce: nonce),
                ]
                if let email = request.email {
                    apple["email"] = email
                    apple["is_private_email"] = email.hasSuffix("@privaterelay.appleid.com")
                }
                return Outgoing(target: .fakeApple, path: "fake/identity-tokens", json: apple, bearer: nil)
            }
            guard let signInStarted else {
                guard answer.status == 200, let apple = object(answer.body), let token = apple["identity_token"] as? String,
                    let code = apple["authorization_code"] as? String
                else {
                    throw Failure(description: "the fake Apple at \(request.fakeAppleURL) answered \(answer.status) to /fake/identity-tokens")
                }
                var body: [String: Any] = ["client_id": request.clientID, "identity_token": token, "nonce": nonce]
                if request.withCode { body["authorization_code"] = code }
                self.signInStarted = .now
                return Outgoing(target: .api, path: "v1/sign-in", json: body, bearer: request.apiToken)
            }
            result = (answer.status, answer.body, ContinuousClock.now - signInStarted)
            return nil
        }
    }

    /// One sign-in; returns the answer and how long the sign-in request took.
    static func signIn(_ request: Request, sub: String, client: HTTPClient) async throws -> (Int, String, Duration) {
        var flow = Flow(request, sub: sub)
        var answer: (status: Int, body: String)?
        while let outgoing = try flow.next(after: answer) {
            let base = outgoing.target == .api ? request.apiURL : request.fakeAppleURL
            var headers = [("Content-Type", "application/json")]
            if let bearer = outgoing.bearer { headers.append(("Authorization", "Bearer \(bearer)")) }
            let reply = try await client.send(
                HTTPRequest(
                    method: "POST", url: base.appendingPathComponent(outgoing.path).absoluteString, headers: headers,
                    body: Array(try JSONSerialization.data(withJSONObject: outgoing.json)), timeout: answerTimeout))
            answer = (reply.status, String(decoding: reply.body, as: UTF8.self))
        }
        return flow.result!
    }

    /// `--count N --concurrency C`: prints `sign-ins/s`, the sign-in request's p50/p99, failures,
    /// and the driver's own CPU per sign-in. C lanes, each one sign-in at a time, share one client
    /// (keep-alive connections to the API and to the fake Apple), so the driver spends little of
    /// the CPU it shares with what it measures.
    /// Longest wait for one request's answer (connect, write and read); a stalled server fails it.
    static let answerTimeout: Duration = .seconds(30)

    private static func load(_ request: Request) async -> Int32 {
        let client = HTTPClient(extraCertificatesPEM: request.caCertificates)
        let started = ContinuousClock.now
        let cpuAtStart = cpuSeconds()
        let results = Locked<(latencies: [Double], failures: Int, firstFailure: String?)>(([], 0, nil))
        let next = Locked(0)
        await withTaskGroup(of: Void.self) { lanes in
            for _ in 0..<request.concurrency {
                lanes.addTask {
                    while let index = next.withLock({ value -> Int? in
                        guard value < request.count else { return nil }
                        value += 1
                        return value - 1
                    }) {
                        do {
                            let (status, body, took) = try await signIn(request, sub: "\(request.sub)-\(index)", client: client)
                            results.withLock { results in
                                if status == 200 { results.latencies.append(took.seconds) } else {
                                    results.failures += 1
                                    if results.firstFailure == nil { results.firstFailure = "\(status) \(body)" }
                                }
                            }
                        } catch {
                            results.withLock { results in
                                results.failures += 1
                                if results.firstFailure == nil { results.firstFailure = "\(error)" }
                            }
                        }
                    }
                }
            }
        }
        let elapsed = (ContinuousClock.now - started).seconds
        let driverCPU = cpuSeconds() - cpuAtStart
        let (latencies, failures, first) = results.withLock { ($0.latencies.sorted(), $0.failures, $0.firstFailure) }
        func percentile(_ p: Double) -> Double {
            latencies.isEmpty ? .nan : latencies[min(latencies.count - 1, Int(Double(latencies.count) * p))] * 1000
        }
        print(
            String(
                format: "RESULT sign_ins=%d failures=%d seconds=%.2f rate=%.1f p50_ms=%.2f p99_ms=%.2f driver_cpu_ms=%.2f",
                latencies.count, failures, elapsed, Double(latencies.count) / elapsed, percentile(0.50), percentile(0.99),
                driverCPU * 1000 / Double(max(request.count, 1))))
        if let first { FileHandle.standardError.write(Data("siwa simulate sign-in: first failure: \(first)\n".utf8)) }
        return failures == 0 ? 0 : 1
    }

    /// CPU time (user + system) this process has used: the driver's own cost per sign-in, so a
    /// benchmark can show the load it puts on the machine it shares with what it measures.
    private static func cpuSeconds() -> Double {
        var usage = rusage()
        guard getrusage(RUSAGE_SELF.rawValue, &usage) == 0 else { return 0 }
        func seconds(_ time: timeval) -> Double { Double(time.tv_sec) + Double(time.tv_usec) / 1e6 }
        return seconds(usage.ru_utime) + seconds(usage.ru_stime)
    }

    static func object(_ body: String) -> [String: Any]? {
        (try? JSONSerialization.jsonObject(with: Data(body.utf8))) as? [String: Any]
    }
}
