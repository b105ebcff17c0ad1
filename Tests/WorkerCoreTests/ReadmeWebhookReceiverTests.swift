import ChildProcesses
import Foundation
import TestTiming
import Testing
import Webhooks

/// The README's receiver example ("Webhooks to the app", Python) run as written, with python3,
/// against what the worker signs: it accepts a delivery, and refuses an altered body, another
/// secret and a stale timestamp. A machine without python3 fails, saying how to install it (`.ci/run`
/// installs it), as the database tests do without PostgreSQL: nothing is skipped.
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

    @Test func theReadmesPythonReceiverAcceptsOurSignatureAndRefusesTampering() async throws {
        let python = try #require(
            Self.python, "python3 is not installed (looked in /usr/bin and /usr/local/bin): apt-get update && apt-get install -y python3")
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
            let outputPath = FileManager.default.temporaryDirectory.appendingPathComponent("readme-receiver-\(UUID().uuidString)").path
            defer { try? FileManager.default.removeItem(atPath: outputPath) }
            let child = try ChildProcess(
                python, ["-c", script, secretText, checked], options: .init(output: .file(outputPath), error: .sameAsOutput))
            guard await child.waitForExit(timeout: TestTimeScale.scaled(.seconds(30))) != nil else {
                await child.stop(SIGKILL, grace: .seconds(10))
                throw ReceiverExampleError(description: "python3 did not finish within 30 s")
            }
            let output = (try? String(contentsOfFile: outputPath, encoding: .utf8)) ?? ""
            return output.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        let other = try WebhookSecret("whsec_" + Data(repeating: 9, count: 32).base64EncodedString())
        #expect(try await check(body: body, signedBody: body, secret: secret, timestamp: now) == "accepted")
        #expect(try await check(body: body + " ", signedBody: body, secret: secret, timestamp: now) == "refused: bad signature")
        #expect(try await check(body: body, signedBody: body, secret: other, timestamp: now) == "refused: bad signature")
        #expect(try await check(body: body, signedBody: body, secret: secret, timestamp: now - 3600) == "refused: stale timestamp")
    }
}

struct ReceiverExampleError: Error, CustomStringConvertible {
    var description: String
}
