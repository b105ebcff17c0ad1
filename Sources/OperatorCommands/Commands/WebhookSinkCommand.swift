import Foundation
import HTTPServer
import Locking
import Logging
import Webhooks
import Settings
import Lifecycle

/// `siwa webhooks sink [--listen 127.0.0.1:9099] [--quiet] [--tls-cert-file CERT.pem --tls-key-file KEY.pem]`:
/// a local receiver (over `https://` when given a certificate and key) to try the worker
/// against (and the benchmark's sink). Checks every signature with SIWA_WEBHOOK_SECRET, answers
/// 204 at once (401 to a bad signature), prints a line per delivery (unless `--quiet`), and serves `GET /stats`: counts,
/// bad signatures, repeats, per-account order breaks, connections accepted (so TLS handshakes, over
/// `https://`; the stats calls' own included), and commit-to-delivery delay percentiles
/// (`POST /stats/reset` starts over; `GET /stats/deliveries` lists `change id,received at` in Unix
/// seconds, for a benchmark to split each delay at the change's commit; `GET /stats/wait?verified=N&seconds=S` answers the stats once
/// N deliveries were verified, or after S seconds: a benchmark waits without polling, so its
/// own queries do not count against the deliveries).
enum WebhookSinkCommand {
    static func run(_ source: ConfigurationSource) async -> Int32 {
        let flags = source.withoutEnvironment()
        let listen: ListenAddress
        let secret: WebhookSecret
        let tls: TLSIdentity?
        do {
            if let unknown = source.unknownFlags(
                known: ["LISTEN", "SIWA_WEBHOOK_SECRET", "SIWA_WEBHOOK_SECRET_FILE", "SIWA_LOG_LEVEL"] + CLI.tlsFlagVariables)
                .first
            {
                throw ConfigurationError(variable: "--\(unknown)", problem: "unknown option")
            }
            listen = try flags.listenAddress("LISTEN", default: "127.0.0.1:9099")
            secret = try WebhookSecret(try source.require("SIWA_WEBHOOK_SECRET"))
            tls = try CLI.tlsIdentity(flags)
        } catch {
            CLI.error("webhooks sink", "\(error)")
            return 2
        }
        let quiet = source.isSet(switch: "quiet")
        let books = SinkBooks()
        let server = HTTPServer(
            configuration: .init(host: listen.host, port: listen.port, connectionLimit: 4096, connectionTimeout: .seconds(30), tls: tls),
            handler: ClosureHTTPHandler { request, respond in
                switch (request.method, request.path) {
                case ("GET", "/stats"): respond(.json(books.statsJSON()))
                case ("GET", "/stats/deliveries"):
                    respond(HTTPResponse(status: 200, headers: [("Content-Type", "text/csv")], body: Array(books.deliveriesCSV().utf8)))
                case ("GET", "/stats/wait"):
                    let target = request.query["verified"].flatMap(Int.init) ?? 0
                    let seconds = min(600, max(0, request.query["seconds"].flatMap(Int.init) ?? 60))
                    books.whenVerified(target, within: .seconds(seconds)) { respond(.json($0)) }
                case ("POST", "/stats/reset"):
                    books.reset()
                    respond(.json(#"{"reset":true}"#))
                case ("POST", _):
                    let (line, verified) = books.record(request, secret: secret)
                    if !quiet { FileHandle.standardOutput.write(Data((line + "\n").utf8)) }
                    // A delivery signed with another secret is refused, as the app's own
                    // receiver must: `siwa webhooks test` with the wrong secret then fails.
                    respond(verified ? .empty(status: 204) : .json(status: 401, #"{"error":"bad_signature"}"#))
                default: respond(.json(status: 405, #"{"error":"method_not_allowed"}"#))
                }
            },
            logger: Logger(label: "webhook-sink", level: .warning))
        do {
            try server.start()
        } catch {
            CLI.error("webhooks sink", "cannot listen on \(listen): \(error)")
            return 1
        }
        let scheme = tls == nil ? "http" : "https"
        FileHandle.standardOutput.write(Data("webhook sink listening on \(scheme)://\(listen.host):\(server.port)/\n".utf8))
        books.countConnections { server.connectionsAccepted }
        _ = await Termination.wait()
        server.stop()
        FileHandle.standardOutput.write(Data((books.statsJSON() + "\n").utf8))
        return 0
    }
}

/// What the sink saw. Delays are kept (up to a million) for percentiles.
final class SinkBooks: Sendable {
    private struct State {
        /// Connections the server had accepted at the last reset (`connections` counts from there).
        var connectionsAtReset = 0
        var received = 0
        var verified = 0
        var badSignature = 0
        var repeats = 0
        var outOfOrder = 0
        var lastID: [String: Int64] = [:]
        var delays: [Double] = []
        /// Change id and receipt time (Unix seconds) of each first verified delivery.
        var receipts: [(id: Int64, at: Double)] = []
        var first: Date?
        var last: Date?
        /// `whenVerified` callers still waiting, by the count they wait for.
        var waiters: [(target: Int, answer: @Sendable (String) -> Void)] = []
    }

    private let state = Locked(State())
    /// The server's count of accepted connections, once it runs.
    private let acceptedConnections = Locked<(@Sendable () -> Int)?>(nil)

    func countConnections(_ accepted: @escaping @Sendable () -> Int) {
        acceptedConnections.withLock { $0 = accepted }
    }

    private var connectionsAccepted: Int { acceptedConnections.withLock { $0 }?() ?? 0 }

    func reset() {
        let accepted = connectionsAccepted
        let waiting = state.withLock { state in
            defer { state = State(connectionsAtReset: accepted) }
            return state.waiters
        }
        for waiter in waiting { waiter.answer(statsJSON()) }
    }

    /// Calls `answer` with the stats once `target` deliveries were verified, or when `limit` has
    /// passed, whichever comes first (the answer is sent once: the HTTP server ignores a second).
    func whenVerified(_ target: Int, within limit: Duration, answer: @escaping @Sendable (String) -> Void) {
        let reached = state.withLock { state in
            if state.verified >= target { return true }
            state.waiters.append((target, answer))
            return false
        }
        if reached {
            answer(statsJSON())
            return
        }
        DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(Int(limit.components.seconds) * 1000)) { [self] in
            answer(statsJSON())
        }
    }

    /// Records one delivery; returns its line and whether its signature verified.
    func record(_ request: HTTPRequest, secret: WebhookSecret) -> (line: String, verified: Bool) {
        let now = Date()
        let verified = WebhookSignature.isValid(
            id: request.header("webhook-id") ?? "", timestamp: request.header("webhook-timestamp") ?? "", body: request.body,
            signatures: request.header("webhook-signature") ?? "", secret: secret, now: now)
        let object = (try? JSONSerialization.jsonObject(with: Data(request.body))) as? [String: Any]
        let id = (object?["id"] as? NSNumber)?.int64Value
        let account = "\(object?["client_id"] as? String ?? "") \(object?["sub"] as? String ?? "")"
        let delay = (object?["created_at"] as? String).flatMap(Self.parseTimestamp).map { now.timeIntervalSince($0) }
        let (verdict, reached) = state.withLock { state -> (String, [@Sendable (String) -> Void]) in
            let verdict = Self.book(&state, now: now, verified: verified, id: id, account: account, delay: delay)
            guard state.waiters.contains(where: { $0.target <= state.verified }) else { return (verdict, []) }
            let verified = state.verified
            let reached = state.waiters.filter { $0.target <= verified }.map(\.answer)
            state.waiters.removeAll { $0.target <= verified }
            return (verdict, reached)
        }
        if !reached.isEmpty {
            let stats = statsJSON()
            for answer in reached { answer(stats) }
        }
        let change = object?["change"] as? String ?? "?"
        return ("webhook-id \(request.header("webhook-id") ?? "-") \(account) \(change): \(verdict)", verified)
    }

    private static func book(
        _ state: inout State, now: Date, verified: Bool, id: Int64?, account: String, delay: Double?
    ) -> String {
        state.received += 1
        state.first = state.first ?? now
        state.last = now
        guard verified else {
            state.badSignature += 1
            return "BAD SIGNATURE"
        }
        state.verified += 1
        if let id, id > 0 {
            if let last = state.lastID[account], id <= last {
                if id == last { state.repeats += 1 } else { state.outOfOrder += 1 }
                return id == last ? "verified, REPEAT (dedupe on webhook-id)" : "verified, OUT OF ORDER"
            }
            state.lastID[account] = id
        }
        if let delay, state.delays.count < 1_000_000 { state.delays.append(delay) }
        if let id, state.receipts.count < 1_000_000 { state.receipts.append((id, now.timeIntervalSince1970)) }
        return "verified"
    }

    func deliveriesCSV() -> String {
        state.withLock { $0.receipts }.map { "\($0.id),\(String(format: "%.6f", $0.at))\n" }.joined()
    }

    func statsJSON() -> String {
        let accepted = connectionsAccepted
        let snapshot = state.withLock { $0 }
        let sorted = snapshot.delays.sorted()
        func percentile(_ p: Double) -> Double {
            guard !sorted.isEmpty else { return 0 }
            return sorted[min(sorted.count - 1, Int((Double(sorted.count - 1) * p).rounded()))] * 1000
        }
        let span = snapshot.first.flatMap { first in snapshot.last.map { $0.timeIntervalSince(first) } } ?? 0
        return """
            {"received":\(snapshot.received),"verified":\(snapshot.verified),"bad_signature":\(snapshot.badSignature),\
            "repeats":\(snapshot.repeats),"out_of_order":\(snapshot.outOfOrder),"span_seconds":\(span),\
            "connections":\(accepted - snapshot.connectionsAtReset),\
            "delay_ms":{"count":\(sorted.count),"p50":\(percentile(0.5)),"p99":\(percentile(0.99)),"max":\(percentile(1))}}
            """
    }

    /// `2026-12-01T01:02:03.456789Z` (the change object's `created_at`).
    static func parseTimestamp(_ text: String) -> Date? {
        let parts = text.dropLast().split(separator: ".", maxSplits: 1)
        guard text.hasSuffix("Z"), let whole = parts.first,
            let base = try? Date(String(whole) + "Z", strategy: .iso8601)
        else { return nil }
        let fraction = parts.count > 1 ? Double("0." + parts[1]) ?? 0 : 0
        return base.addingTimeInterval(fraction)
    }
}
