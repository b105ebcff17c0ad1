import Foundation
import Testing

/// What a newcomer does after `siwa dev` (or `./deploy/run.sh`) starts: paste the printed export
/// lines in another shell, type `siwa status`, and try the fake Apple's examples from `siwa help
/// fake-apple` against dev's fake, which serves https with a throwaway CA.
@Suite(.serialized) struct DevPasteBlockTests {
    @Test func afterThePasteBlockSiwaIsOnPathAndTheFakeAppleExamplesRun() async throws {
        let database = try await LifecycleHarness.makeDatabase()
        do {
            try await walkThrough(databaseURL: database.url)
        } catch {
            await database.drop()
            throw error
        }
        await database.drop()
    }

    private func walkThrough(databaseURL: String) async throws {
        let dev = try ServiceProcess(
            "siwa", arguments: ["dev", "--no-worker"],
            environment: [
                "DATABASE_URL": databaseURL, "SIWA_LISTEN": "127.0.0.1:0", "SIWA_OPS_LISTEN": "127.0.0.1:0",
                "SIWA_APP_API_LISTEN": "127.0.0.1:0", "SIWA_DEV_EXIT_AFTER": "120",  // a bound if the test dies
                "HOME": ProcessInfo.processInfo.environment["HOME"] ?? "/tmp",
            ])
        do {
            // The banner ends with the line to type once the block is pasted.
            _ = try await dev.firstLogLine("the banner's `siwa status` line", timeout: .seconds(90)) {
                $0.trimmingCharacters(in: .whitespaces) == "siwa status" ? "" : nil
            }
            let exports = dev.log.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }.filter { $0.hasPrefix("export ") }
            #expect(exports.first?.hasPrefix("export PATH=") == true, "the block puts siwa on PATH: \(exports)")
            #expect(exports.contains { $0.hasPrefix("export SIWA_CA_FILE=") }, "dev's fake serves https: \(exports)")
            // Every listener was given port 0: the URLs printed are the ports dev read back.
            let receiver = try #require(DevFlowTests.capture(#"receiver health +(http://\S+)/healthz"#, in: dev.log), "\(dev.log)")
            #expect(exports.contains("export SIWA_RECEIVER_URL=\(receiver)/apple/notifications"), "\(exports)")
            let health = try await HTTP.request("GET", receiver + "/healthz")
            #expect(health.status == 200 && !receiver.hasSuffix(":0"), "\(receiver): \(health)")

            let help = try await Siwa.run(["help", "fake-apple"], environment: [:], timeout: .seconds(30))
            let examples = Self.curlExamples(help.stdout)
            #expect(examples.count == 4, "\(help.stdout)")
            let expected = [
                "/fake/codes": "\"code\"", "/fake/identity-tokens": "\"identity_token\"", "/fake/failures": "\"queued\"",
                "/fake/authorize-user": "\"authorize\"",
            ]
            for example in examples {
                let run = try await Self.shell(exports + [example])
                let endpoint = expected.keys.first { example.contains($0 + " ") } ?? "?"
                #expect(run.status == 0 && run.stdout.contains(expected[endpoint] ?? "?"), "\(example)\n\(run.stdout)\(run.stderr)")
            }
            let status = try await Self.shell(exports + ["siwa status"])
            #expect(status.status == 0 && status.stdout.contains("pending deletions"), "\(status.stdout)\(status.stderr)")
        } catch {
            dev.signal(SIGINT)
            _ = await dev.waitForExit(timeout: .seconds(30))
            throw error
        }
        dev.signal(SIGINT)
        #expect(await dev.waitForExit(timeout: .seconds(30)) == 0, "\(dev.log.suffix(3000))")
    }

    /// Each `curl ...` example of the help, its `\` continuation lines joined.
    static func curlExamples(_ help: String) -> [String] {
        var examples: [String] = []
        var pending: String?
        for line in help.split(separator: "\n").map({ $0.trimmingCharacters(in: .whitespaces) }) {
            if var current = pending {
                current += " " + line
                pending = current.hasSuffix("\\") ? String(current.dropLast()) : nil
                if pending == nil { examples.append(current) }
            } else if line.hasPrefix("curl ") {
                if line.hasSuffix("\\") { pending = String(line.dropLast()) } else { examples.append(line) }
            }
        }
        return examples
    }

    /// The lines run by bash, as a person's shell would, with no siwa setting of the test's own.
    static func shell(_ lines: [String]) async throws -> Siwa.Run {
        try await Siwa.run(["-c", (["set -e"] + lines).joined(separator: "\n")], environment: [:], executable: "/bin/bash", timeout: .seconds(60))
    }
}
