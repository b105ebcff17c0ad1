import Foundation
import LocalPostgres
import Testing

/// pg_ctl starts the server, which lives as long as the cluster: a descriptor of ours without
/// close-on-exec must not go along. A socket a test had closed or reset stayed open in the
/// server of a cluster another test started meanwhile, so the client never saw the close (in full
/// runs, HostileEndpointTests' reset case waited out its 20 s timeout).
@Suite struct LocalPostgresDescriptorTests {
    @Test func theServerHoldsNoDescriptorOfTheProcessThatStartedIt() async throws {
        // A file opened without O_CLOEXEC stands for such a socket.
        let marker = FileManager.default.temporaryDirectory.appendingPathComponent("siwa-fd-marker-\(UUID().uuidString)").path
        let descriptor = open(marker, O_WRONLY | O_CREAT, 0o600)
        #expect(descriptor > 2)
        defer {
            close(descriptor)
            unlink(marker)
        }
        let cluster = try await LocalPostgresClusterForTest.start()
        do {
            let pidFile = try String(contentsOfFile: cluster.dataDirectory + "/postmaster.pid", encoding: .utf8)
            let serverPID = try #require(pidFile.split(separator: "\n").first.flatMap { Int32($0) })
            let descriptors = try FileManager.default.contentsOfDirectory(atPath: "/proc/\(serverPID)/fd")
            let targets = descriptors.compactMap { try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(serverPID)/fd/\($0)") }
            #expect(!targets.isEmpty, "the server's descriptors could not be read")
            #expect(!targets.contains(marker), "the server holds \(marker)")
        } catch {
            try? await cluster.stop()
            throw error
        }
        try await cluster.stop()
    }
}
