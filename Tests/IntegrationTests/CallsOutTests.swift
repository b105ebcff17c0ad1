#if canImport(Glibc)
    import Glibc
#endif
import Foundation
import ScriptedHTTPServer
import TestTiming
import Testing

/// The calls-out rules through the built `siwa`: the proxy variables, `SIWA_CA_FILE`, and the
/// memory a process holds of an endless answer (its own peak RSS, read by wait4).
@Suite("Calls out") struct CallsOutTests {
    static let webhook = ["SIWA_WEBHOOK_SECRET": WebhookDeliveryTests.secret]

    @Test func theProxyVariablesAreHonoured() async throws {
        // A proxy that refuses every tunnel: what it was asked for is the proof it was used.
        let proxy = try ScriptedHTTPServer { _ in .answer("HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n", thenClose: true) }
        defer { proxy.stop() }
        // Not a loopback host: calls to this machine never use a proxy (Sources/AppAPI/README.md, "The edge").
        let target = "https://hooks.example.invalid:9/hooks?key=v"
        for variable in ["HTTPS_PROXY", "https_proxy"] {
            let before = proxy.heads.count
            let run = try await Siwa.run(
                ["webhooks", "test"], environment: Self.webhook.merging(["SIWA_WEBHOOK_URL": target, variable: "http://127.0.0.1:\(proxy.port)"]) { $1 })
            #expect(run.status == 1, "\(run.stdout)\(run.stderr)")
            #expect(proxy.heads.count == before + 1, "\(variable)")
            #expect(proxy.heads.last?.hasPrefix("CONNECT hooks.example.invalid:9 HTTP/1.1\r\n") == true, "\(proxy.heads)")
        }
        // A loopback target never goes through it, whatever the variables say.
        let local = try await Siwa.run(
            ["webhooks", "test"],
            environment: Self.webhook.merging(["SIWA_WEBHOOK_URL": "https://127.0.0.1:9/hooks", "HTTPS_PROXY": "http://127.0.0.1:\(proxy.port)"]) { $1 })
        #expect(local.status == 1)
        #expect(!proxy.heads.contains { $0.contains("127.0.0.1:9") }, "\(proxy.heads)")
        for variable in ["NO_PROXY", "no_proxy"] {
            let before = proxy.heads.count
            _ = try await Siwa.run(
                ["webhooks", "test"],
                environment: Self.webhook.merging(["SIWA_WEBHOOK_URL": target, "HTTPS_PROXY": "http://127.0.0.1:\(proxy.port)", variable: "hooks.example.invalid"]) { $1 })
            #expect(proxy.heads.count == before, "\(variable): the call went through the proxy")
        }
    }

    @Test func aPrivateCAIsTrustedOnlyWhenGiven() async throws {
        let endpoint = try ScriptedHTTPServer(tls: .localhost) { _ in .answer("HTTP/1.1 204 No Content\r\n\r\n") }
        defer { endpoint.stop() }
        let environment = Self.webhook.merging(["SIWA_WEBHOOK_URL": "https://localhost:\(endpoint.port)/hooks"]) { $1 }
        let trusted = try await Siwa.run(["webhooks", "test"], environment: environment.merging(["SIWA_CA_FILE": TLSFixture.caPath]) { $1 })
        #expect(trusted.status == 0, "\(trusted.stdout)\(trusted.stderr)")
        #expect(trusted.stdout.contains("answered 204"))
        let untrusted = try await Siwa.run(["webhooks", "test"], environment: environment)
        #expect(untrusted.status == 1)
        #expect(untrusted.stdout.contains("tls"), "\(untrusted.stdout)")
        let notPEM = try await Siwa.run(["webhooks", "test"], environment: environment.merging(["SIWA_CA_FILE": "/etc/hostname"]) { $1 })
        #expect(notPEM.status == 2, "\(notPEM.stdout)\(notPEM.stderr)")
        #expect(endpoint.heads.count == 1, "only the trusted call was sent")
    }

    @Test func anEndlessAnswerIsNeverHeld() async throws {
        // 2 GB offered after a 200 head: read and dropped past 1 MiB, and the 200 counts. Measured
        // against the same command answered `{}`: what the endless answer adds is what it held (a
        // whole body held was 2.6 GB; dropped, about 10 MB). Not a fixed peak: a sanitizer's shadow
        // memory moves the baseline (50 MB here, 94 MB under ThreadSanitizer), not what is held.
        func peak(_ reply: ScriptedHTTPServer.Reply) async throws -> (status: Int32, peakKilobytes: Int) {
            let endpoint = try ScriptedHTTPServer(tls: .localhost) { _ in reply }
            defer { endpoint.stop() }
            let environment = ServiceProcess.childEnvironment(
                Self.webhook.merging(["SIWA_WEBHOOK_URL": "https://127.0.0.1:\(endpoint.port)/hooks", "SIWA_CA_FILE": TLSFixture.caPath]) { $1 })
            return try await PeakMemory.run(try ServiceProcess.executable("siwa").path, ["webhooks", "test"], environment: environment)
        }
        let small = try await peak(.answer("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"))
        #expect(small.status == 0)
        let endless = try await peak(
            .endless(head: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n7fffffff\r\n", bodyBytes: 2_000_000_000))
        #expect(endless.status == 0, "a 200 head is delivered whatever the body")
        print("calls out: siwa webhooks test peaked at \(small.peakKilobytes) kB answered {}, \(endless.peakKilobytes) kB answered endlessly")
        #expect(endless.peakKilobytes - small.peakKilobytes < 64 << 10,
                "siwa webhooks test peaked at \(endless.peakKilobytes) kB for the endless answer, \(small.peakKilobytes) kB for {}")
    }
}

/// Runs a program and returns its exit status and its own peak RSS (wait4's ru_maxrss, kB, which
/// `ChildProcess` records as it reaps); killed after `timeout` (times `TestTimeScale`).
enum PeakMemory {
    static func run(_ path: String, _ arguments: [String], environment: [String: String], timeout: Duration = .seconds(60))
        async throws -> (status: Int32, peakKilobytes: Int)
    {
        let outcome = try await ProgramRun.run(path, arguments, environment: environment, timeout: timeout)
        return (outcome.status, outcome.peakKilobytes)
    }
}
