import ChildProcesses
import Foundation
import LocalPostgres
import Testing
import TestTiming

/// A test process that dies by SIGKILL leaves no PostgreSQL and no child service behind, nor the
/// cluster's folder: the orphan reaper the test support and `siwa dev` share cleans up after it. The
/// test runs this very test bundle as a child, with only the helper test selected.
@Suite struct TestProcessCrashTests {
    static let helperVariable = "SIWA_CRASH_HELPER_FOLDER"
    static let isHelper = ProcessInfo.processInfo.environment[helperVariable] != nil

    /// The child's part: a throwaway cluster and a service started the way tests start them, then
    /// a wait to be killed in. Skipped (and reported so) in an ordinary run, never passed empty.
    @Test(.enabled(if: isHelper, "runs only as the child of aKilledTestProcessLeavesNothingBehind"))
    func helperStartsAClusterAndAServiceThenWaits() async throws {
        let folder = try #require(ProcessInfo.processInfo.environment[Self.helperVariable])
        let cluster = try await LocalPostgresCluster.start(logger: TestDatabase.logger)
        let service = try ServiceProcess("siwa", arguments: ["fake-apple", "--listen", "127.0.0.1:0"], environment: [:])
        _ = try await ServiceProcessPort.wait(service)
        try "\(service.processIdentifier)\n".write(toFile: folder + "/ready", atomically: true, encoding: .utf8)
        try await Task.sleep(for: .seconds(120))
        withExtendedLifetime((cluster, service)) {}
    }

    @Test(.enabled(if: !isHelper, "the helper's own run does not start another helper"))
    func aKilledTestProcessLeavesNothingBehind() async throws {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("siwa-crash-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        chmod(folder, 0o755)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let child = try ChildProcess(
            CommandLine.arguments[0], ["--testing-library", "swift-testing", "--filter", "helperStartsAClusterAndAServiceThenWaits"],
            options: .init(environment: ServiceProcess.childEnvironment([Self.helperVariable: folder, "TMPDIR": folder])))
        defer { child.signal(SIGKILL) }

        try await waitUntil("the helper wrote its ready file, or ended", timeout: .seconds(120), every: .milliseconds(100)) {
            FileManager.default.fileExists(atPath: folder + "/ready") || !child.isRunning
        }
        let ready = try #require(try? String(contentsOfFile: folder + "/ready", encoding: .utf8), "the helper never got ready")
        let service = try #require(Int32(ready.trimmingCharacters(in: .whitespacesAndNewlines)))
        let server = try #require(DevCleanupTests.postmasterPID(in: folder))
        #expect(ProcessTree.isAlive(service) && ProcessTree.isAlive(server))

        #expect(child.signal(SIGKILL), "the helper ended before it was killed")
        func clusterFolders() -> [String] {
            ((try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? []).filter { $0.hasPrefix("siwa-pg-") }
        }
        // A bound for a watchdog that never acts, not a speed requirement (pg_ctl stop under load).
        try await waitUntil(
            "the watchdog stopped the service and PostgreSQL and deleted the cluster's folder", timeout: .seconds(60),
            every: .milliseconds(100),
            detail: "service alive: \(ProcessTree.isAlive(service)), PostgreSQL alive: \(ProcessTree.isAlive(server)), folders: \(clusterFolders())"
        ) { !ProcessTree.isAlive(service) && !ProcessTree.isAlive(server) && clusterFolders().isEmpty }
    }
}

/// Waits for a service's `listening on http://...` line.
enum ServiceProcessPort {
    static func wait(_ service: ServiceProcess, timeout: Duration = .seconds(60)) async throws -> String {
        try await service.firstLogLine("a listening line", timeout: timeout) {
            DevFlowTests.capture(#"listening on (http://[0-9.:]+)"#, in: String($0))
        }
    }
}
