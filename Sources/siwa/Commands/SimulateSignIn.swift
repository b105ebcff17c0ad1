import AppleClient
import Foundation
import Locking
import LoopbackHTTP
import SiwaCore
#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// `siwa simulate sign-in --client-id ID --sub SUB [--api-url URL] [--api-token T]
/// [--fake-apple-url URL] [--email E] [--no-code]`: the whole sign-in of seed 000 against the app
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
            let session = makeSession(connections: 1)
            do {
                let (status, body, _) = try await signIn(request, sub: request.sub, session: session)
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
            concurrency: try flags.integer("CONCURRENCY", default: 1, range: 1...1024))
    }

    private static func makeSession(connections: Int) -> URLSession {
        let configuration = URLSessionConfiguration.ephemeral
        configuration.timeoutIntervalForRequest = 30
        configuration.httpMaximumConnectionsPerHost = max(connections, 1)
        return URLSession(configuration: configuration)
    }

    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    /// The three requests of one sign-in, written once for both transports: `next` takes the answer
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

    /// One sign-in over URLSession; returns the answer and how long the sign-in request took.
    static func signIn(_ request: Request, sub: String, session: URLSession) async throws -> (Int, String, Duration) {
        var flow = Flow(request, sub: sub)
        var answer: (status: Int, body: String)?
        while let outgoing = try flow.next(after: answer) {
            let base = outgoing.target == .api ? request.apiURL : request.fakeAppleURL
            answer = try await post(base.appendingPathComponent(outgoing.path), json: outgoing.json, bearer: outgoing.bearer, session: session)
        }
        return flow.result!
    }

    /// `--count N --concurrency C`: prints `sign-ins/s`, the sign-in request's p50/p99, failures,
    /// and the driver's own CPU per sign-in. Each of the C lanes is a thread with one keep-alive
    /// connection to the API and one to the fake Apple, so the driver spends little of the CPU it
    /// shares with what it measures.
    /// Longest wait for one request's answer (connect, write and read); a stalled server fails it.
    static let answerTimeout: Duration = .seconds(30)
    /// Largest answer kept (the driver's answers are a few hundred bytes).
    static let maximumAnswerBytes = 1 << 20

    private static func load(_ request: Request) async -> Int32 {
        // Each lane has its own clients: one keep-alive connection to each. Answers are JSON kept whole.
        let client: @Sendable (URL) -> LoopbackHTTPClient? = { url in LoopbackHTTPClient(url: url, keptBodyBytes: Self.maximumAnswerBytes) }
        guard client(request.apiURL) != nil, client(request.fakeAppleURL) != nil else {
            FileHandle.standardError.write(Data("siwa simulate sign-in: --count drives a local stack: --api-url and --fake-apple-url must be http:// to 127.0.0.1:PORT (or another loopback address)\n".utf8))
            return 2
        }
        let started = ContinuousClock.now
        let cpuAtStart = cpuSeconds()
        let results = Locked<(latencies: [Double], failures: Int, firstFailure: String?)>(([], 0, nil))
        let next = Locked(0)
        let lane: @Sendable () -> Void = {
            guard let api = client(request.apiURL), let apple = client(request.fakeAppleURL) else { return }
            while true {
                let index = next.withLock { value -> Int? in
                    guard value < request.count else { return nil }
                    value += 1
                    return value - 1
                }
                guard let index else { return }
                do {
                    var flow = Flow(request, sub: "\(request.sub)-\(index)")
                    var answer: (status: Int, body: String)?
                    while let outgoing = try flow.next(after: answer) {
                        let body = try JSONSerialization.data(withJSONObject: outgoing.json)
                        let reply = try (outgoing.target == .api ? api : apple).post(
                            Array(body), to: "/" + outgoing.path, headers: outgoing.bearer.map { [("Authorization", "Bearer \($0)")] } ?? [],
                            deadline: .now + Self.answerTimeout)
                        guard reply.bodyEnd == .whole else {
                            let why = reply.bodyEnd == .cutShort ? "cut short by the server" : "over 1 MiB"
                            throw Failure(description: "/\(outgoing.path) answered \(reply.status) with a body \(why)")
                        }
                        answer = (reply.status, String(decoding: reply.body, as: UTF8.self))
                    }
                    let (status, body, took) = flow.result!
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
        await runOnThreads(count: request.concurrency, lane)
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

    /// Runs `body` on `count` threads of their own (blocking I/O must not hold the shared pool) and
    /// returns when all have.
    private static func runOnThreads(count: Int, _ body: @escaping @Sendable () -> Void) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let group = DispatchGroup()
            for _ in 0..<count {
                group.enter()
                Thread {
                    body()
                    group.leave()
                }.start()
            }
            group.notify(queue: .global()) { continuation.resume() }
        }
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

    private static func post(_ url: URL, json: [String: Any], bearer: String?, session: URLSession) async throws -> (Int, String) {
        var request = URLRequest(url: url)
        request.httpMethod = "POST"
        request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        if let bearer { request.setValue("Bearer \(bearer)", forHTTPHeaderField: "Authorization") }
        request.httpBody = try JSONSerialization.data(withJSONObject: json)
        let (body, response) = try await SimulateCommand.fetch(
            request, session: session, what: "the server", hint: "--api-url and --fake-apple-url, or "
                + "SIWA_APP_API_URL and SIWA_APPLE_BASE_URL (siwa dev prints them)")
        return ((response as? HTTPURLResponse)?.statusCode ?? 0, String(decoding: body, as: UTF8.self))
    }
}
