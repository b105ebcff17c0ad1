import CryptoCore
import FakeApple
import Foundation
import SiwaCore
#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// `siwa simulate TYPE --sub SUB --client-id ID [--email E] [--private-email true|false]
/// [--event-time MS] [--jti J] [--receiver-url URL] [--fake-apple-url URL]`: signs a notification
/// with the fake Apple's key and posts it to the receiver. Exit 0 on 200, 1 otherwise.
enum SimulateCommand: CLICommand {
    static let name = "simulate"
    static let summary = "sign a test notification with the fake Apple's key and post it to the receiver"

    static func run(_ source: ConfigurationSource) async -> Int32 {
        let notification: FakeNotification
        let receiverURL: URL
        let fakeURL: URL
        do {
            let flags = try CommandFlags.source()
            guard let type = source.positional.first, FakeNotification.types.contains(type) else {
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
            notification = FakeNotification(
                type: type, sub: try flags.require("SUB"), clientID: try flags.require("CLIENT_ID"),
                email: try flags.string("EMAIL"), isPrivateEmail: isPrivate, eventTime: eventTime, jti: try flags.string("JTI"))
            guard let receiver = URL(string: try flags.string("RECEIVER_URL") ?? "http://127.0.0.1:8080/apple/notifications"),
                let fake = URL(string: try flags.string("FAKE_APPLE_URL") ?? "http://127.0.0.1:9443")
            else { throw ConfigurationError(variable: "--receiver-url", problem: "not a URL") }
            receiverURL = receiver
            fakeURL = fake
        } catch {
            FileHandle.standardError.write(Data("siwa simulate: \(error)\n".utf8))
            return 2
        }
        do {
            let (keyData, keyResponse) = try await URLSession.shared.data(from: fakeURL.appendingPathComponent("fake/signing-key"))
            guard (keyResponse as? HTTPURLResponse)?.statusCode == 200,
                let object = try JSONSerialization.jsonObject(with: keyData) as? [String: Any],
                let kid = object["kid"] as? String, let pem = object["pem"] as? String
            else {
                FileHandle.standardError.write(Data("siwa simulate: the fake Apple at \(fakeURL) has no signing key\n".utf8))
                return 1
            }
            let jws = try notification.signed(keyID: kid, privateKey: try RSA.PrivateKey(pemRepresentation: pem))
            var request = URLRequest(url: receiverURL)
            request.httpMethod = "POST"
            request.setValue("application/json", forHTTPHeaderField: "Content-Type")
            request.httpBody = try JSONSerialization.data(withJSONObject: ["payload": jws])
            let (body, response) = try await URLSession.shared.data(for: request)
            let status = (response as? HTTPURLResponse)?.statusCode ?? 0
            print("\(status) \(String(decoding: body, as: UTF8.self))")
            return status == 200 ? 0 : 1
        } catch {
            FileHandle.standardError.write(Data("siwa simulate: \(error)\n".utf8))
            return 1
        }
    }
}
