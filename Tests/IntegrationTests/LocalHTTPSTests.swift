import Foundation
import TestTiming
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// `siwa fake-apple` and `siwa webhooks sink` over `https://` (`--tls-cert-file`, `--tls-key-file`),
/// and `siwa dev` running its fake Apple so with a throwaway CA: checked with Debian's curl, an
/// independent TLS client, trusting only the CA it is given.
@Suite("HTTPS on loopback", .serialized)
struct LocalHTTPSTests {
    @Test func fakeAppleServesHTTPSToAClientTrustingTheCA() async throws {
        try await withCertificates { certificates, teardown in
            let fake = try ServiceProcess(
                "siwa", arguments: ["fake-apple", "--listen", "127.0.0.1:0"] + certificates.serverArguments,
                environment: ["SIWA_LOG_LEVEL": "warning"])
            teardown.add { await fake.stop() }
            let url = try await EndToEndStack.waitForListening(fake)
            #expect(url.hasPrefix("https://127.0.0.1:"), "\(url)")
            try await Self.expectServedOnlyOverVerifiedTLS(url + "/auth/keys", ca: certificates.caFile, body: #""keys""#)
        }
    }

    @Test func webhookSinkServesHTTPSToAClientTrustingTheCA() async throws {
        try await withCertificates { certificates, teardown in
            let sink = try ServiceProcess(
                "siwa", arguments: ["webhooks", "sink", "--listen", "127.0.0.1:0", "--quiet"] + certificates.serverArguments,
                environment: ["SIWA_WEBHOOK_SECRET": WebhookDeliveryTests.secret])
            teardown.add { await sink.stop() }
            let url = try await Self.listeningURL(sink, prefix: "webhook sink listening on ")
            #expect(url.hasPrefix("https://127.0.0.1:"), "\(url)")
            try await Self.expectServedOnlyOverVerifiedTLS(url + "stats", ca: certificates.caFile, body: #""verified""#)
        }
    }

    @Test func aCertificateWithoutItsKeyIsRefusedAtStart() async throws {
        try await withCertificates { certificates, _ in
            let run = try await Siwa.run(
                ["fake-apple", "--listen", "127.0.0.1:0", "--tls-cert-file", certificates.certificateFile], environment: [:],
                timeout: .seconds(120))
            #expect(run.status == 2 && run.stderr.contains("--tls-key-file"), "\(run.stderr)")
            let unreadable = try await Siwa.run(
                ["webhooks", "sink", "--listen", "127.0.0.1:0", "--tls-cert-file", certificates.certificateFile,
                 "--tls-key-file", certificates.keyFile + ".missing"],
                environment: ["SIWA_WEBHOOK_SECRET": WebhookDeliveryTests.secret], timeout: .seconds(120))
            #expect(unreadable.status == 2 && unreadable.stderr.contains("--tls-key-file"), "\(unreadable.stderr)")
            // A key that is not the certificate's: libmicrohttpd (GnuTLS) refuses to start, no crash.
            let other = try TestCertificates(in: URL(fileURLWithPath: certificates.caFile).deletingLastPathComponent(), prefix: "other-")
            let mismatched = try await Siwa.run(
                ["fake-apple", "--listen", "127.0.0.1:0", "--tls-cert-file", certificates.certificateFile,
                 "--tls-key-file", other.keyFile], environment: [:], timeout: .seconds(120))
            #expect(mismatched.status == 1 && mismatched.stderr.contains("daemonStartFailed"), "\(mismatched.stderr)")
            #expect(!mismatched.stderr.contains("PRIVATE KEY"))
        }
    }

    /// `SIWA_DEV_FAKE_APPLE_TLS=on`: dev makes a CA and a certificate in its private folder (key 0600),
    /// runs the fake over `https://` and says where the CA is; all of it is removed on Ctrl-C. (The
    /// rest of the run, the receiver fetching the fake's keys over https, needs an outbound client
    /// that reads `SIWA_CA_FILE`: DevFlowTests cover it once `DevCertificates.onByDefault` is on.)
    @Test func devRunsTheFakeAppleOverHTTPSWithAThrowawayCA() async throws {
        let database = try await LifecycleHarness.makeDatabase()
        do {
            try await withTeardown { teardown in
                let dev = try ServiceProcess(
                    "siwa", arguments: ["dev", "--no-worker"],
                    environment: [
                        // Until the receiver can read SIWA_CA_FILE it never gets ready: dev must keep
                        // waiting for it while the test looks at the fake, then stop on the test's SIGINT.
                        "DATABASE_URL": database.url, "SIWA_DEV_FAKE_APPLE_TLS": "on", "SIWA_DEV_READY_TIMEOUT": "600",
                        "SIWA_DEV_EXIT_AFTER": "300",
                        "SIWA_LISTEN": "127.0.0.1:0", "SIWA_OPS_LISTEN": "127.0.0.1:0",
                        "SIWA_APP_API_LISTEN": "127.0.0.1:0",
                    ])
                // Its children live in their own process groups: only dev's own stop ends them.
                teardown.add {
                    if dev.isRunning { dev.signal(SIGINT) }
                    _ = await dev.waitForExit(timeout: .seconds(30))
                }
                _ = try await dev.firstLogLine("its fake Apple's address", timeout: .seconds(90)) {
                    $0.contains("[dev] fake Apple listening on ") ? true : nil
                }
                let log = dev.log
                let fakeURL = try #require(DevFlowTests.capture(#"fake Apple listening on (https://127\.0\.0\.1:[0-9]+)"#, in: log), "\(log)")
                let caFile = try #require(DevFlowTests.capture(#"throwaway CA: (/\S+)"#, in: log), "\(log)")
                let folder = URL(fileURLWithPath: caFile).deletingLastPathComponent().path
                #expect(folder.hasPrefix("/tmp/siwa-dev-"))
                let folderMode = try FileManager.default.attributesOfItem(atPath: folder)[.posixPermissions] as? Int
                #expect(folderMode == 0o700)
                let keyMode = try FileManager.default.attributesOfItem(atPath: folder + "/fake-apple-key.pem")[.posixPermissions] as? Int
                #expect(keyMode == 0o600)
                try await Self.expectServedOnlyOverVerifiedTLS(fakeURL + "/auth/keys", ca: caFile, body: #""keys""#)
                dev.signal(SIGINT)
                #expect(await dev.waitForExit(timeout: .seconds(30)) == 0, "\(dev.log)")
                #expect(!FileManager.default.fileExists(atPath: folder), "the throwaway CA is removed on exit")
            }
        } catch {
            await database.drop()
            throw error
        }
        await database.drop()
    }

    // MARK: Helpers

    /// 200 with `body` in it through curl trusting only `ca`; refused (certificate problem) without
    /// it, refused to a client offering at most TLS 1.1, and refused over plain `http://`.
    static func expectServedOnlyOverVerifiedTLS(_ url: String, ca: String, body: String) async throws {
        let trusted = try await curl(["--cacert", ca, "--write-out", "\n%{http_code} %{ssl_verify_result}", url])
        #expect(trusted.status == 0, "\(trusted.stderr)")
        #expect(trusted.stdout.contains(body) && trusted.stdout.hasSuffix("\n200 0"), "\(trusted.stdout)")
        let localhost = try await curl(["--cacert", ca, "--write-out", "%{http_code}", "--output", "/dev/null",
                                        url.replacingOccurrences(of: "127.0.0.1", with: "localhost")])
        #expect(localhost.stdout == "200", "\(localhost.stderr)")
        // 60: the peer certificate cannot be authenticated with the system's CAs alone.
        let untrusted = try await curl(["--cacert", "/etc/ssl/certs/ca-certificates.crt", url])
        #expect(untrusted.status == 60, "\(untrusted.status) \(untrusted.stderr)")
        let oldTLS = try await curl(["--cacert", ca, "--tlsv1", "--tls-max", "1.1", url])
        #expect(oldTLS.status != 0, "a TLS 1.1 handshake was accepted")
        let plain = try await curl([url.replacingOccurrences(of: "https://", with: "http://")])
        #expect(plain.status != 0 || !plain.stdout.contains(body), "answered over plain http")
    }

    static func listeningURL(_ process: ServiceProcess, prefix: String) async throws -> String {
        try await process.firstLogLine("a line starting \(prefix)") { line in
            line.hasPrefix(prefix) ? String(line.dropFirst(prefix.count)) : nil
        }
    }

    private func withCertificates(_ body: (TestCertificates, Teardown) async throws -> Void) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("siwa-tls-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        try await withTeardown { teardown in try await body(try TestCertificates(in: directory), teardown) }
    }
}
