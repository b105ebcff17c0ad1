import CryptoCore
import FakeApple
import Foundation
import Settings

/// `siwa simulate sign-in ...` runs a whole sign-in against the app API (SimulateSignIn.swift).
///
/// `siwa simulate TYPE --sub SUB --client-id ID [--email E] [--private-email true|false]
/// [--event-time MS] [--jti J] [--receiver-url URL] [--fake-apple-url URL]`: signs a notification
/// with the fake Apple's key and posts it to the receiver. Exit 0 on 200, 1 otherwise.
///
/// Bulk, for load tests: `--count N --output FILE [--sub-prefix P]` signs N notifications (distinct
/// jti, sub `P<i>`) and writes one request body per line instead of posting.
enum SimulateCommand: CLICommand {
    static let name = "simulate"
    static let summary = "sign test notifications with the fake Apple's key and post them; or `simulate sign-in` against the app API"

    private struct Request {
        var type: String
        var sub: String?
        var subPrefix: String
        var clientID: String
        var email: String?
        var isPrivateEmail: Bool?
        var eventTime: Int64?
        var jti: String?
        var count: Int
        var output: String?
        var receiverURL: URL
        var fakeAppleURL: URL
    }

    static func run(_ source: ConfigurationSource) async -> Int32 {
        if source.positional.first == "sign-in" { return await SimulateSignIn.run(source) }
        let request: Request
        do {
            request = try parse(source.withoutEnvironment(), environment: source, type: source.positional.first)
        } catch {
            FileHandle.standardError.write(Data("siwa simulate: \(error)\n".utf8))
            return 2
        }
        do {
            let (keyID, key) = try await signingKey(from: request.fakeAppleURL)
            if let output = request.output {
                try writeBodies(request, to: output, keyID: keyID, key: key)
                return 0
            }
            var allStored = true
            for index in 0..<request.count {
                let jws = try notification(request, index: index).signed(keyID: keyID, privateKey: key)
                let (status, body) = try await post(jws, to: request.receiverURL)
                print("\(status) \(body)")
                allStored = allStored && status == 200
            }
            return allStored ? 0 : 1
        } catch {
            FileHandle.standardError.write(Data("siwa simulate: \(error)\n".utf8))
            return 1
        }
    }

    /// Flags first; the URLs then from the variables `siwa dev` prints (`environment`).
    private static func parse(_ flags: ConfigurationSource, environment: ConfigurationSource, type: String?) throws -> Request {
        guard let type, FakeNotification.types.contains(type) else {
            throw ConfigurationError(variable: "TYPE", problem: "one of \(FakeNotification.types.joined(separator: ", "))")
        }
        let isPrivate: Bool?
        switch try flags.string("PRIVATE_EMAIL") {
        case nil: isPrivate = nil
        case "true": isPrivate = true
        case "false": isPrivate = false
        default: throw ConfigurationError(variable: "--private-email", problem: "true or false")
        }
        var eventTime: Int64?
        if let text = try flags.string("EVENT_TIME") {
            guard let value = Int64(text) else { throw ConfigurationError(variable: "--event-time", problem: "milliseconds") }
            eventTime = value
        }
        let count = try flags.integer("COUNT", default: 1, range: 1...10_000_000)
        let sub = try flags.string("SUB")
        guard sub != nil || count > 1 else { throw ConfigurationError(variable: "--sub", problem: "is required") }
        let jti = try flags.string("JTI")
        guard count == 1 || jti == nil else {
            throw ConfigurationError(variable: "--jti", problem: "cannot be combined with --count")
        }
        let receiverText = try flags.string("RECEIVER_URL") ?? environment.string("SIWA_RECEIVER_URL")
        guard let receiver = URL(string: receiverText ?? "http://127.0.0.1:8080/apple/notifications"), receiver.host != nil
        else { throw ConfigurationError(variable: "--receiver-url", problem: "not a URL") }
        let fakeText = try flags.string("FAKE_APPLE_URL") ?? environment.string("SIWA_APPLE_BASE_URL")
        guard let fake = URL(string: fakeText ?? "http://127.0.0.1:9443"), fake.host != nil
        else { throw ConfigurationError(variable: "--fake-apple-url", problem: "not a URL") }
        return Request(
            type: type, sub: sub, subPrefix: try flags.string("SUB_PREFIX") ?? "sim-", clientID: try flags.require("CLIENT_ID"),
            email: try flags.string("EMAIL"), isPrivateEmail: isPrivate, eventTime: eventTime, jti: jti,
            count: count, output: try flags.string("OUTPUT"), receiverURL: receiver, fakeAppleURL: fake)
    }

    /// The `index`th notification: for `--sub` S, every one is about S; without it, sub `<prefix><index>`.
    private static func notification(_ request: Request, index: Int) -> FakeNotification {
        let sub = request.sub ?? request.subPrefix + String(index)
        return FakeNotification(
            type: request.type, sub: sub, clientID: request.clientID, email: request.email,
            isPrivateEmail: request.isPrivateEmail, eventTime: request.eventTime, jti: request.jti)
    }

    /// Signs in parallel (one slice per core) and writes `{"payload":"<JWS>"}` lines, with progress.
    private static func writeBodies(_ request: Request, to path: String, keyID: String, key: RSA.PrivateKey) throws {
        let slices = max(1, ProcessInfo.processInfo.activeProcessorCount)
        var lines = [[String]](repeating: [], count: slices)
        let failure = LockedError()
        let done = AtomicCounter()
        lines.withUnsafeMutableBufferPointer { buffer in
            let base = UnsafeMutableBufferPointerBox(buffer)
            DispatchQueue.concurrentPerform(iterations: slices) { slice in
                var mine: [String] = []
                for index in stride(from: slice, to: request.count, by: slices) {
                    do {
                        let jws = try notification(request, index: index).signed(keyID: keyID, privateKey: key)
                        mine.append(#"{"payload":"\#(jws)"}"#)
                    } catch {
                        failure.set(error)
                        return
                    }
                    let finished = done.increment()
                    if finished % 10_000 == 0 {
                        FileHandle.standardError.write(Data("siwa simulate: signed \(finished)/\(request.count)\n".utf8))
                    }
                }
                base.buffer[slice] = mine
            }
        }
        if let error = failure.value { throw error }
        var text = ""
        // Interleave the slices back into index order.
        for index in 0..<request.count { text += lines[index % slices][index / slices] + "\n" }
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        FileHandle.standardError.write(Data("siwa simulate: wrote \(request.count) bodies to \(path)\n".utf8))
    }

    private static func signingKey(from fakeAppleURL: URL) async throws -> (String, RSA.PrivateKey) {
        let answer = try await CLIHTTP.call(
            "GET", fakeAppleURL.appendingPathComponent("fake/signing-key"), caCertificates: try CommonSettings.caCertificates(.init(arguments: [])),
            target: .init(what: "the fake Apple", hint: "--fake-apple-url or SIWA_APPLE_BASE_URL (siwa dev prints it)"))
        guard answer.status == 200,
            let object = try JSONSerialization.jsonObject(with: Data(answer.body.utf8)) as? [String: Any],
            let kid = object["kid"] as? String, let pem = object["pem"] as? String
        else {
            throw ConfigurationError(variable: "--fake-apple-url", problem: "the fake Apple at \(fakeAppleURL) has no signing key")
        }
        return (kid, try RSA.PrivateKey(pemRepresentation: pem))
    }

    private static func post(_ jws: String, to url: URL) async throws -> (Int, String) {
        let answer = try await CLIHTTP.call(
            "POST", url, json: try JSONSerialization.data(withJSONObject: ["payload": jws]),
            caCertificates: try CommonSettings.caCertificates(.init(arguments: [])),
            target: .init(what: "the receiver", hint: "--receiver-url or SIWA_RECEIVER_URL (siwa dev prints it)"))
        return (answer.status, answer.body)
    }
}

/// Lets `concurrentPerform` slices write their own element of one array without a lock.
private struct UnsafeMutableBufferPointerBox<Element>: @unchecked Sendable {
    // @unchecked: each slice writes a distinct index, and the array outlives the perform.
    let buffer: UnsafeMutableBufferPointer<Element>
    init(_ buffer: UnsafeMutableBufferPointer<Element>) { self.buffer = buffer }
}

private final class LockedError: @unchecked Sendable {
    // @unchecked: guarded by `lock`.
    private let lock = NSLock()
    private var stored: (any Error)?
    func set(_ error: any Error) { lock.withLock { if stored == nil { stored = error } } }
    var value: (any Error)? { lock.withLock { stored } }
}

private final class AtomicCounter: @unchecked Sendable {
    // @unchecked: guarded by `lock`.
    private let lock = NSLock()
    private var count = 0
    func increment() -> Int { lock.withLock { count += 1; return count } }
}
