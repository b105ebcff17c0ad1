import Foundation
import Testing
import Webhooks

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
    func theReadmesPythonReceiverAcceptsOurSignatureAndRefusesTampering() async throws {
        let secretText = "whsec_" + Data((0..<32).map { UInt8($0 * 7 & 0xFF) }).base64EncodedString()
        let secret = try WebhookSecret(secretText)
        let body = #"{"id":42,"client_id":"com.example.app","sub":"001.x","app_user_id":null,"change":"consent_revoked","status":"consent_revoked","reason":null,"created_at":"2026-12-01T01:02:03.456Z"}"#
        let now = Int64(Date().timeIntervalSince1970)
        func check(body checked: String, signedBody: String, secret signingSecret: WebhookSecret, timestamp: Int64) async throws
            -> String
        {
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
            // Run and read on a thread that may block, not on the test pool's few threads.
            let output = try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Data, any Error>) in
                DispatchQueue(label: "readme-receiver").async {
                    do {
                        let process = Process()
                        process.executableURL = URL(fileURLWithPath: Self.python!)
                        process.arguments = ["-c", script, secretText, checked]
                        let pipe = Pipe()
                        process.standardOutput = pipe
                        process.standardError = pipe
                        try process.run()
                        let data = pipe.fileHandleForReading.readDataToEndOfFile()
                        process.waitUntilExit()
                        continuation.resume(returning: data)
                    } catch {
                        continuation.resume(throwing: error)
                    }
                }
            }
            return String(decoding: output, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        }
        let other = try WebhookSecret("whsec_" + Data(repeating: 9, count: 32).base64EncodedString())
        #expect(try await check(body: body, signedBody: body, secret: secret, timestamp: now) == "accepted")
        #expect(try await check(body: body + " ", signedBody: body, secret: secret, timestamp: now) == "refused: bad signature")
        #expect(try await check(body: body, signedBody: body, secret: other, timestamp: now) == "refused: bad signature")
        #expect(try await check(body: body, signedBody: body, secret: secret, timestamp: now - 3600) == "refused: stale timestamp")
    }
}
