import Foundation
import Locking

/// A listener of one of `siwa dev`'s children and the info line the child logs once it is bound
/// (`"listen":"127.0.0.1:53117"`). A listener given port 0 binds one the system picks, and dev
/// reads it back from that line: a port chosen by dev and then bound by the child could be taken
/// by another process in between (two test processes running `siwa dev` at once did).
struct DevListener: Sendable, Hashable {
    /// The line's `msg`.
    var message: String
    /// The field holding `host:port`.
    var field: String

    static let receiver = DevListener(message: "siwa-receiver listening", field: "listen")
    static let workerOps = DevListener(message: "siwa-worker started", field: "ops_listen")
    static let appAPI = DevListener(message: "siwa-worker app API listening", field: "app_api.listen")

    /// The port `line` reports when it is this listener's line.
    func port(in line: String) -> Int? {
        guard line.hasPrefix("{"), line.contains(message),
            let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
            object["msg"] as? String == message, let address = object[field] as? String,
            let colon = address.lastIndex(of: ":"), let port = Int(address[address.index(after: colon)...]), port > 0
        else { return nil }
        return port
    }
}

/// The ports dev's children reported, filled in by their reader threads.
final class DevBoundPorts: Sendable {
    private let ports = Locked<[DevListener: Int]>([:])

    /// Records the port `line` reports for any of `listeners` (the first report stands).
    func read(_ line: String, for listeners: [DevListener]) {
        for listener in listeners {
            if let port = listener.port(in: line) { ports.withLock { $0[listener] = $0[listener] ?? port } }
        }
    }

    func port(of listener: DevListener) -> Int? { ports.withLock { $0[listener] } }
}
