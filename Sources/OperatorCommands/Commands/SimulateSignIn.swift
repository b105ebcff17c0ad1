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
/// Exit 0 on 200, 1 otherwise. `--web-url URL --return-to R`: the browser's flow instead (see `Flow`).
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
        /// `--web-url`: the web flow through this receiver (its SIWA_PUBLIC_URL), returning to `returnTo`.
        var web: (base: String, returnTo: String)?
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

    static let options = ["CLIENT_ID", "SUB", "EMAIL", "API_URL", "API_TOKEN", "FAKE_APPLE_URL", "COUNT", "CONCURRENCY", "WEB_URL", "RETURN_TO"]

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
        var web: (base: String, returnTo: String)?
        if let base = try flags.string("WEB_URL") {
            guard let returnTo = try flags.string("RETURN_TO") else {
                throw ConfigurationError(variable: "--return-to", problem: "is required with --web-url (a URL of the receiver's SIWA_WEB_RETURN_URLS)")
            }
            web = (base.hasSuffix("/") ? String(base.dropLast()) : base, returnTo)
        } else if try flags.string("RETURN_TO") != nil {
            throw ConfigurationError(variable: "--return-to", problem: "needs --web-url")
        }
        return Request(
            clientID: try flags.require("CLIENT_ID"), sub: try flags.require("SUB"), email: try flags.string("EMAIL"),
            withCode: !flags.isSet(switch: "no-code"), apiURL: try url("API_URL", "http://127.0.0.1:8081"), apiToken: token,
            fakeAppleURL: try url("FAKE_APPLE_URL", "http://127.0.0.1:9443"),
            count: try flags.integer("COUNT", default: 1, range: 1...10_000_000),
            concurrency: try flags.integer("CONCURRENCY", default: 1, range: 1...1024),
            caCertificates: try CommonSettings.caCertificates(environment), web: web)
    }

    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    /// The requests of one sign-in: `next` takes the answer to the previous request (nil at
    /// first) and gives the next request, or nil when done; then `result` holds the sign-in's answer.
    /// Native (an app with Apple's sheet): a nonce, the fake Apple's identity token for its hash,
    /// `POST /v1/sign-in`. Web (`--web-url`, a browser's flow): `GET /apple/sign-in` on the receiver,
    /// the fake Apple's authorize page (its form read as a browser would submit it), Apple's
    /// `form_post` to the callback, then `POST /v1/sign-in {"ticket"}` with the return URL's ticket.
    struct Flow {
        struct Outgoing {
            var method: String
            var url: String
            var contentType: String?
            var body: [UInt8]
            var bearer: String?
        }

        struct Answer {
            var status: Int
            var body: String
            var location: String?
        }

        private enum Stage { case start, nonce, appleToken, webStart, authorize, callback, signIn, done }

        let request: Request
        let sub: String
        private var stage = Stage.start
        private var nonce = ""
        private var signInStarted: ContinuousClock.Instant?
        private(set) var result: (status: Int, body: String, took: Duration)?

        init(_ request: Request, sub: String) {
            self.request = request
            self.sub = sub
        }

        mutating func next(after answer: Answer?) throws -> Outgoing? {
            switch stage {
            case .start:
                if let web = request.web {
                    stage = .webStart
                    let query = Self.form([("client_id", request.clientID), ("return_to", web.returnTo)])
                    return Outgoing(method: "GET", url: "\(web.base)/apple/sign-in?\(query)", body: [])
                }
                stage = .nonce
                return api("v1/nonces", [:])
            case .nonce:
                guard let answer, answer.status == 201, let nonce = object(answer.body)?["nonce"] as? String else {
                    throw Failure(description: "POST \(request.apiURL)/v1/nonces answered \(answer.map { "\($0.status) \($0.body)" } ?? "nothing")")
                }
                self.nonce = nonce
                var apple: [String: Any] = [
                    "client_id": request.clientID, "sub": sub, "nonce": IdentityTokenVerifier.nonceClaim(rawNonce: nonce),
                ]
                if let email = request.email {
                    apple["email"] = email
                    apple["is_private_email"] = email.hasSuffix("@privaterelay.appleid.com")
                }
                stage = .appleToken
                return Outgoing(
                    method: "POST", url: request.fakeAppleURL.appendingPathComponent("fake/identity-tokens").absoluteString,
                    contentType: "application/json", body: Array(try JSONSerialization.data(withJSONObject: apple)))
            case .appleToken:
                guard let answer, answer.status == 200, let apple = object(answer.body), let token = apple["identity_token"] as? String,
                    let code = apple["authorization_code"] as? String
                else {
                    throw Failure(description: "the fake Apple at \(request.fakeAppleURL) answered \(answer?.status ?? 0) to /fake/identity-tokens")
                }
                var body: [String: Any] = ["client_id": request.clientID, "identity_token": token, "nonce": nonce]
                if request.withCode { body["authorization_code"] = code }
                return signIn(body)
            case .webStart:
                guard let answer, answer.status == 302, let location = answer.location else {
                    throw Failure(description: "GET /apple/sign-in answered \(answer?.status ?? 0) \(answer?.body ?? "")")
                }
                // Who signs in, as the fake's chooser would send it back to its authorize page.
                var extra = [("sub", sub), ("first_name", "Bench"), ("last_name", "User")]
                if let email = request.email { extra.append(("email", email)) }
                stage = .authorize
                return Outgoing(method: "GET", url: location + "&" + Self.form(extra), body: [])
            case .authorize:
                guard let answer, answer.status == 200, let post = Self.formPost(in: answer.body) else {
                    throw Failure(description: "the fake Apple's authorize page answered \(answer?.status ?? 0) without a form")
                }
                stage = .callback
                return Outgoing(
                    method: "POST", url: post.action, contentType: "application/x-www-form-urlencoded",
                    body: Array(Self.form(post.fields).utf8))
            case .callback:
                guard let answer, answer.status == 303, let location = answer.location,
                    let ticket = URLComponents(string: location)?.queryItems?.first(where: { $0.name == "siwa_ticket" })?.value
                else {
                    throw Failure(description: "the callback answered \(answer?.status ?? 0) \(answer?.location ?? answer?.body ?? "")")
                }
                return signIn(["ticket": ticket])
            case .signIn:
                guard let answer, let signInStarted else { throw Failure(description: "the sign-in was not answered") }
                result = (answer.status, answer.body, ContinuousClock.now - signInStarted)
                stage = .done
                return nil
            case .done:
                return nil
            }
        }

        private func api(_ path: String, _ json: [String: Any]) -> Outgoing {
            Outgoing(
                method: "POST", url: request.apiURL.appendingPathComponent(path).absoluteString, contentType: "application/json",
                body: Array((try? JSONSerialization.data(withJSONObject: json)) ?? Data()), bearer: request.apiToken)
        }

        private mutating func signIn(_ body: [String: Any]) -> Outgoing {
            stage = .signIn
            signInStarted = .now
            return api("v1/sign-in", body)
        }

        static func form(_ items: [(String, String)]) -> String {
            var allowed = CharacterSet.alphanumerics
            allowed.insert(charactersIn: "-._~")
            return items.map { "\($0.0)=\($0.1.addingPercentEncoding(withAllowedCharacters: allowed) ?? "")" }.joined(separator: "&")
        }

        /// The form Apple's page submits by itself: its action and hidden fields (HTML entities of
        /// attribute values undone), as a browser would post them.
        static func formPost(in page: String) -> (action: String, fields: [(String, String)])? {
            func attribute(_ name: String, in tag: Substring) -> String? {
                guard let start = tag.range(of: "\(name)=\""), let end = tag[start.upperBound...].firstIndex(of: "\"") else { return nil }
                return unescape(tag[start.upperBound..<end])
            }
            guard let formTag = page.range(of: "<form").map({ page[$0.lowerBound...].prefix(while: { $0 != ">" }) }),
                let action = attribute("action", in: formTag)
            else { return nil }
            var fields: [(String, String)] = []
            for piece in page.components(separatedBy: "<input").dropFirst() {
                let tag = Substring(piece).prefix(while: { $0 != ">" })
                if let name = attribute("name", in: tag) { fields.append((name, attribute("value", in: tag) ?? "")) }
            }
            return (action, fields)
        }

        private static func unescape(_ text: Substring) -> String {
            text.replacingOccurrences(of: "&quot;", with: "\"").replacingOccurrences(of: "&#39;", with: "'")
                .replacingOccurrences(of: "&lt;", with: "<").replacingOccurrences(of: "&gt;", with: ">")
                .replacingOccurrences(of: "&amp;", with: "&")
        }
    }

    /// One sign-in; returns the answer and how long the sign-in request took.
    static func signIn(_ request: Request, sub: String, client: HTTPClient) async throws -> (Int, String, Duration) {
        var flow = Flow(request, sub: sub)
        var answer: Flow.Answer?
        while let outgoing = try flow.next(after: answer) {
            var headers: [(String, String)] = []
            if let contentType = outgoing.contentType { headers.append(("Content-Type", contentType)) }
            if let bearer = outgoing.bearer { headers.append(("Authorization", "Bearer \(bearer)")) }
            let reply = try await client.send(
                HTTPRequest(method: outgoing.method, url: outgoing.url, headers: headers, body: outgoing.body, timeout: answerTimeout))
            answer = Flow.Answer(status: reply.status, body: String(decoding: reply.body, as: UTF8.self), location: reply.headers["location"])
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
