import Foundation
import Testing

/// `siwa help COMMAND`, `siwa COMMAND --help` and `-h`: the command's usage on stdout, exit 0,
/// nothing started (no database is given, so a command that ran would fail); an unknown flag exits 2
/// naming it, for every command and both services.
/// Serialized: dozens of short processes at once would crowd out the suites running beside it.
@Suite(.serialized) struct CLIHelpTests {
    static let commands = ["migrate", "status", "jobs", "dev", "fake-apple", "simulate", "accounts", "webhooks"]

    /// A flag (or setting) each command takes, which its usage must list.
    static let ownFlag = [
        "migrate": "DATABASE_URL", "status": "--json", "jobs": "--kind", "dev": "--no-worker", "fake-apple": "--listen",
        "simulate": "--receiver-url", "accounts": "--target-team", "webhooks": "--listen",
    ]

    @Test(arguments: commands) func helpInEachFormPrintsUsage(_ command: String) async throws {
        var texts: [String] = []
        for arguments in [["help", command], [command, "--help"], [command, "-h"]] {
            let run = try await Siwa.run(arguments, environment: [:], timeout: .seconds(30))
            #expect(run.status == 0, "\(arguments): \(run.stderr)")
            #expect(run.stdout.hasPrefix("usage: siwa \(command)"), "\(arguments): \(run.stdout)")
            #expect(run.stdout.contains(Self.ownFlag[command]!), "\(arguments) lists its flags")
            // Nothing started: dev would print its steps, the others an error about DATABASE_URL.
            #expect(!run.stdout.contains("[dev]") && run.stderr.isEmpty, "\(arguments): \(run.stderr)")
            texts.append(run.stdout)
        }
        #expect(Set(texts).count == 1, "the three forms print the same text")
    }

    @Test func devHelpListsEveryFlagWithItsDefault() async throws {
        let run = try await Siwa.run(["dev", "-h"], environment: [:], timeout: .seconds(30))
        for flag in ["--once", "--no-fake-apple", "--no-worker"] { #expect(run.stdout.contains(flag)) }
        #expect(run.stdout.contains("SIWA_LISTEN  [0.0.0.0:8080"), "\(run.stdout)")
        #expect(run.stdout.contains("SIWA_DEV_READY_TIMEOUT  [60]"))
    }

    @Test func fakeAppleHelpShowsEachTestEndpointWithAnExample() async throws {
        let run = try await Siwa.run(["help", "fake-apple"], environment: [:], timeout: .seconds(30))
        for endpoint in ["/fake/codes", "/fake/identity-tokens", "/fake/failures"] {
            #expect(run.stdout.contains(#"-X POST "$SIWA_APPLE_BASE_URL"\#(endpoint)"#), "\(endpoint)")
        }
    }

    @Test(arguments: commands) func unknownFlagExitsTwoNamingIt(_ command: String) async throws {
        let run = try await Siwa.run([command, "--bogus", "1"], environment: [:], timeout: .seconds(30))
        #expect(run.status == 2, "\(command): \(run.stdout) \(run.stderr)")
        #expect(run.stderr.contains("--bogus"), "\(command): \(run.stderr)")
        #expect(!run.stdout.contains("[dev]"), "nothing started")
    }

    @Test(arguments: ["siwa-receiver", "siwa-worker"]) func servicesHaveHelpAndRefuseUnknownFlags(_ program: String) async throws {
        let help = try await Siwa.run(["--help"], environment: [:], executable: program, timeout: .seconds(30))
        #expect(help.status == 0 && help.stdout.hasPrefix("usage: \(program)"), "\(help.stderr)")
        for variable in ["DATABASE_URL", "SIWA_CLIENT_IDS", "SIWA_LOG_LEVEL"] { #expect(help.stdout.contains(variable)) }
        #expect(help.stdout.contains(program == "siwa-worker" ? "SIWA_WORKER_CONCURRENCY  [4]" : "SIWA_LISTEN  [0.0.0.0:8080"))
        let unknown = try await Siwa.run(["--bogus", "1"], environment: [:], executable: program, timeout: .seconds(30))
        #expect(unknown.status == 2 && unknown.stderr.contains("--bogus"), "\(unknown.stderr)")
    }

    @Test func aMissingOwnFlagIsNamedAsTheFlag() async throws {
        let run = try await Siwa.run(["simulate", "consent-revoked", "--sub", "s1"], environment: [:], timeout: .seconds(30))
        #expect(run.status == 2)
        #expect(run.stderr.contains("--client-id: is required"), "\(run.stderr)")
        #expect(!run.stderr.contains("CLIENT_ID"))
    }
}
