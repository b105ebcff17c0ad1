import Foundation
import Postgres
import Synchronization
import Testing
import TestTiming

#if canImport(Glibc)
    import Glibc
#endif

/// A real `siwa-receiver` under hostile traffic: slow clients holding connections, and a burst far
/// above what it may queue.
@Suite("Faults: receiver under load")
struct FaultReceiverTests {
    @Test func slowClientsDoNotStarveOthersAndAreClosedWhenIdle() async throws {
        try await withMigratedDatabase { database in
            try await withTeardown { teardown in
                let keys = try TestAppleKeys()
                defer { keys.stop() }
                let (receiver, base) = try await ReceiverUnderTest.start(
                    databaseURL: database.url, keys: keys,
                    extra: ["SIWA_RECEIVER_CONNECTION_TIMEOUT": "2", "SIWA_LOG_LEVEL": "info"])
                teardown.add { await receiver.stop() }
                let port = UInt16(URL(string: base)!.port!)

                // 200 connections that trickle a request header, a byte every half second each.
                let slow = try (0..<200).map { _ in try RawConnection(port: port) }
                defer { slow.forEach { $0.close() } }
                let header = Array("POST /apple/notifications HTTP/1.1\r\nHost: 127.0.0.1\r\n".utf8)
                let trickle = Task {
                    for index in 0..<8 {
                        for connection in slow { connection.send([header[index]]) }
                        try? await Task.sleep(for: .milliseconds(500))
                    }
                }
                // Meanwhile 50 well-behaved posts: every one answered 200.
                try await Task.sleep(for: .milliseconds(300))
                let bodies = try (0..<50).map { _ in TestAppleKeys.body(try keys.sign(TestAppleKeys.claims())) }
                let statuses = try await concurrentMap(bodies, width: 10) { body in
                    try await HTTP.request("POST", base + "/apple/notifications", body: body).status
                }
                #expect(statuses.allSatisfy { $0 == 200 }, "\(statuses)")
                await trickle.value

                // They go quiet: the idle timeout (2 s) closes every one.
                var open = slow
                try await waitUntil("every idle slow connection is closed", timeout: .seconds(15), every: .milliseconds(200), detail: "\(open.count) still open") {
                    open = open.filter { !$0.isClosedByPeer() }
                    return open.isEmpty
                }
                #expect(try await HTTP.request("GET", base + "/healthz").status == 200)
                print("fault.slow_clients: 200 slow, 50 normal answered \(Set(statuses)), closed when idle \(slow.count - open.count)")
            }
        }
    }

    @Test func aRequestTrickledByteByByteIsCutOffAtTheRequestDeadline() async throws {
        try await withMigratedDatabase { database in
            try await withTeardown { teardown in
                let keys = try TestAppleKeys()
                defer { keys.stop() }
                // The idle timeout (30 s) never fires for a client sending a byte every 200 ms; the
                // whole-request deadline (1 s) does.
                let (receiver, base) = try await ReceiverUnderTest.start(
                    databaseURL: database.url, keys: keys,
                    extra: ["SIWA_RECEIVER_REQUEST_TIMEOUT": "1s", "SIWA_RECEIVER_CONNECTION_TIMEOUT": "30"])
                teardown.add { await receiver.stop() }
                let slow = try RawConnection(port: UInt16(URL(string: base)!.port!))
                defer { slow.close() }
                let header = Array("POST /apple/notifications HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: \(String(repeating: "a", count: 200))".utf8)
                var sent = 0
                while sent < header.count, !slow.isClosedByPeer() {
                    slow.send([header[sent]])
                    sent += 1
                    try await Task.sleep(for: .milliseconds(200))
                }
                #expect(slow.isClosedByPeer(), "a request trickled for \(sent) bytes was never cut off")
                // A well-behaved request is untouched by it.
                #expect(try await HTTP.request("POST", base + "/apple/notifications", body: TestAppleKeys.body(try keys.sign(TestAppleKeys.claims()))).status == 200)
            }
        }
    }

    @Test func oneAddressCannotTakeMoreThanItsShareOfConnections() async throws {
        try await withMigratedDatabase { database in
            try await withTeardown { teardown in
                let keys = try TestAppleKeys()
                defer { keys.stop() }
                let (receiver, base) = try await ReceiverUnderTest.start(
                    databaseURL: database.url, keys: keys,
                    extra: ["SIWA_RECEIVER_PER_ADDRESS_LIMIT": "4", "SIWA_RECEIVER_CONNECTION_TIMEOUT": "30"])
                teardown.add { await receiver.stop() }
                let port = UInt16(URL(string: base)!.port!)
                // Four idle connections from 127.0.0.1 hold its share (the readiness poll's are closed).
                try await Task.sleep(for: .milliseconds(200))
                let held = try (0..<4).map { _ in try RawConnection(port: port) }
                defer { held.forEach { $0.close() } }
                for connection in held { connection.send(Array("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n".utf8)) }
                // A fifth is accepted by the kernel and closed by the server at once.
                let fifth = try RawConnection(port: port)
                defer { fifth.close() }
                try await waitUntil("a fifth connection from one address is closed", timeout: .seconds(10)) { fifth.isClosedByPeer() }
                held.forEach { $0.close() }  // (the deferred close then does nothing)
                // Freed: the address may connect again.
                try await waitUntil("the address may connect again", timeout: .seconds(10), every: .milliseconds(50)) {
                    (try? await HTTP.request("GET", base + "/healthz").status) == 200
                }
            }
        }
    }

    @Test func burstFarAboveCapacityShedsLoadAndStoresEvery200() async throws {
        try await withMigratedDatabase { database in
            try await withTeardown { teardown in
                let keys = try TestAppleKeys()
                defer { keys.stop() }
                let (receiver, base) = try await ReceiverUnderTest.start(
                    databaseURL: database.url, keys: keys,
                    extra: ["SIWA_RECEIVER_MAX_PENDING": "32", "SIWA_RECEIVER_DB_CONNECTIONS": "1", "SIWA_LOG_LEVEL": "info"])
                teardown.add { await receiver.stop() }
                let path = base + "/apple/notifications"
                let jtis = (0..<3000).map { "burst-\($0)-\(UUID().uuidString)" }
                let bodies = try jtis.map { TestAppleKeys.body(try keys.sign(TestAppleKeys.claims(sub: "s-\($0)", jti: $0))) }

                let peakRSS = LockedBox(0)
                let sampling = LockedBox(true)
                let sampler = Task {
                    while sampling.value {
                        if let rss = residentKilobytes(receiver.processIdentifier) { peakRSS.withValue { $0 = max($0, rss) } }
                        try? await Task.sleep(for: .milliseconds(50))
                    }
                }
                // How fast commits drain depends on the machine's fsync rate: on a fast disk one committer
                // keeps up with 400 clients and nothing is shed. So the test holds a lock that stalls
                // inserts until the first 503 comes back, then lets the rest through; every 200 answered
                // before and after must still be stored.
                let blocker = try await database.connect()
                defer { blocker.close() }
                try await blocker.simpleQuery("BEGIN; LOCK TABLE siwa.notifications IN SHARE MODE")
                let firstRefusal = LockedBox(false)
                let release = Task {
                    // Released after 30 s even if nothing was refused (the test then says so).
                    try? await waitUntil("the first 503") { firstRefusal.value }
                    try await blocker.simpleQuery("COMMIT")
                }
                let answers = try await concurrentMap(Array(zip(jtis, bodies)), width: 400) { pair in
                    let (status, text) = try await WideHTTP.post(path, body: pair.1)
                    if status == 503 { firstRefusal.value = true }
                    return BurstAnswer(jti: pair.0, status: status, body: text)
                }
                try await release.value
                sampling.value = false
                await sampler.value

                var byStatus: [Int: Int] = [:]
                for answer in answers { byStatus[answer.status, default: 0] += 1 }
                #expect(Set(byStatus.keys).isSubset(of: [200, 503]), "\(byStatus)")
                let refused = answers.filter { $0.status == 503 }
                // Shed at the door (`overloaded`), or queued and not committed within the bound
                // (`database_timeout`: on a slow machine the lock's release can come after it; such a
                // row may still land, and Apple's retry of it is deduplicated by jti).
                let overloaded = #"{"error":"overloaded"}"#, timedOut = #"{"error":"database_timeout"}"#
                #expect(Set(refused.map(\.body)).isSubset(of: [overloaded, timedOut]), "\(Set(refused.map(\.body)))")
                #expect(refused.contains { $0.body == overloaded }, "a burst of 3000 at 400 at once over max pending 32 sheds some: \(byStatus)")
                let connection = try await database.connect()
                defer { connection.close() }
                let stored = Set(try await connection.query("SELECT jti FROM siwa.notifications").map { try $0.decode(String.self, column: "jti") })
                let answered200 = Set(answers.filter { $0.status == 200 }.map(\.jti))
                #expect(answered200.subtracting(stored).isEmpty, "\(answered200.subtracting(stored).count) answered 200 but not stored")
                let shed = Set(refused.filter { $0.body == overloaded }.map(\.jti))
                #expect(shed.intersection(stored).isEmpty, "\(shed.intersection(stored).count) shed as overloaded but stored")
                let mayHaveLanded = Set(refused.filter { $0.body == timedOut }.map(\.jti))
                #expect(stored.subtracting(answered200).isSubset(of: mayHaveLanded),
                    "stored \(stored.count), answered 200: \(answered200.count), timed out: \(mayHaveLanded.count)")
                // 200 MB; not under AddressSanitizer (deploy/sanitize.sh), whose shadow memory and
                // quarantine alone exceed it.
                let rssBound = ProcessInfo.processInfo.environment["ASAN_OPTIONS"] == nil ? 200 * 1024 : Int.max
                #expect(peakRSS.value > 0 && peakRSS.value < rssBound, "peak RSS \(peakRSS.value) kB")
                #expect(receiver.isRunning)
                print("fault.burst: \(byStatus), peak receiver RSS \(peakRSS.value / 1024) MB")
            }
        }
    }
}

struct BurstAnswer: Sendable {
    var jti: String
    var status: Int
    var body: String
}

/// A blocking TCP client socket on 127.0.0.1, for clients no HTTP library would imitate.
final class RawConnection: Sendable {
    let descriptor: Int32
    private let closed = Atomic<Bool>(false)

    init(port: UInt16) throws {
        descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard descriptor >= 0 else { throw ServiceProcessError(message: "socket: errno \(errno)") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = port.bigEndian
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard result == 0 else {
            Glibc.close(descriptor)
            throw ServiceProcessError(message: "connect: errno \(errno)")
        }
    }

    func send(_ bytes: [UInt8]) {
        _ = bytes.withUnsafeBytes { Glibc.send(descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
    }

    /// True once the server has closed (EOF or reset); never blocks.
    func isClosedByPeer() -> Bool {
        var buffer = [UInt8](repeating: 0, count: 512)
        let count = buffer.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
        if count == 0 { return true }
        if count < 0 { return errno != EAGAIN && errno != EWOULDBLOCK }
        return false  // it answered something; still open
    }

    /// Closes once, however often called: a second close(2) could close whatever socket the
    /// process opened meanwhile under the same number (a server's connection, another client).
    func close() {
        guard !closed.exchange(true, ordering: .acquiringAndReleasing) else { return }
        Glibc.close(descriptor)
    }
}
