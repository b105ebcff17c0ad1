import Foundation
import SiwaCore
import Testing
import WorkerCore

/// The README's receiver example ("Webhooks to the app", Python) run as written, with python3,
/// against what the worker signs: it accepts a delivery, and refuses an altered body, another
/// secret and a stale timestamp. Skipped only where python3 is missing.
@Suite struct ReadmeWebhookReceiverTests {
    static let readme = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("README.md")

    /// The first ```python block after "A receiver, in Python".
    static func receiverExample() throws -> String {
        let text = try String(contentsOf: readme, encoding: .utf8)
        let after = try #require(text.range(of: "A receiver, in Python"))
        let start = try #require(text.range(of: "```python\n", range: after.upperBound..<text.endIndex))
        let end = try #require(text.range(of: "\n```", range: start.upperBound..<text.endIndex))
        return String(text[start.upperBound..<end.lowerBound])
    }

    static let python: String? = ["/usr/bin/python3", "/usr/local/bin/python3"].first {
        FileManager.default.isExecutableFile(atPath: $0)
    }

    @Test(.enabled(if: python != nil, "python3 not installed"))
    func theReadmesPythonReceiverAcceptsOurSignatureAndRefusesTampering() throws {
        let secretText = "whsec_" + Data((0..<32).map { UInt8($0 * 7 & 0xFF) }).base64EncodedString()
        let secret = try WebhookSecret(secretText)
        let body = #"{"id":42,"client_id":"com.example.app","sub":"001.x","app_user_id":null,"change":"consent_revoked","status":"consent_revoked","reason":null,"created_at":"2026-12-01T01:02:03.456Z"}"#
        let now = Int64(Date().timeIntervalSince1970)
        func check(body checked: String, signedBody: String, secret signingSecret: WebhookSecret, timestamp: Int64) throws -> String {
            let headers = WebhookSignature.headers(id: "42", timestamp: timestamp, body: Array(signedBody.utf8), secret: signingSecret)
            let headerDict = "{" + headers.map { "\"\($0.0)\": \"\($0.1)\"" }.joined(separator: ", ") + "}"
            let script = try Self.receiverExample() + """

                import sys
                try:
                    verify(sys.argv[1], \(headerDict), sys.argv[2].encode())
                    print("accepted")
                except Exception as error:
                    print("refused:", error)
                """
            let process = Process()
            process.executableURL = URL(fileURLWithPath: Self.python!)
            process.arguments = ["-c", script, secretText, checked]
            let output = Pipe()
            process.standardOutput = output
            process.standardError = output
            try process.run()
            let data = output.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            return String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        }
        let other = try WebhookSecret("whsec_" + Data(repeating: 9, count: 32).base64EncodedString())
        #expect(try check(body: body, signedBody: body, secret: secret, timestamp: now) == "accepted")
        #expect(try check(body: body + " ", signedBody: body, secret: secret, timestamp: now) == "refused: bad signature")
        #expect(try check(body: body, signedBody: body, secret: other, timestamp: now) == "refused: bad signature")
        #expect(try check(body: body, signedBody: body, secret: secret, timestamp: now - 3600) == "refused: stale timestamp")
    }
}
