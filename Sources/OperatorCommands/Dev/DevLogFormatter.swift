import Foundation
#if canImport(Glibc)
    import Glibc
#endif
import Locking
import Logging

/// Turns the children's JSON log lines (`{"ts","level","logger","msg",...}`) into
/// `[receiver] 12:04:05 info  siwa-receiver listening listen=127.0.0.1:8080`; other lines pass through.
enum DevLogFormatter {
    /// The line formatted, or nil when its level is below `minimum` (children log at least info,
    /// whatever `SIWA_LOG_LEVEL` says, so that dev reads where they listen).
    static func format(_ line: String, prefix: String, from minimum: Logger.Level) -> String? {
        if minimum > .info, line.hasPrefix("{"),
            let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
            let name = object["level"] as? String, let level = Logger.Level(configurationValue: name), level < minimum
        {
            return nil
        }
        return format(line, prefix: prefix)
    }

    static func format(_ line: String, prefix: String) -> String {
        guard line.hasPrefix("{"),
            let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
            let message = object["msg"] as? String
        else { return "[\(prefix)] \(line)" }
        var time = object["ts"] as? String ?? ""
        if let t = time.firstIndex(of: "T") { time = String(time[time.index(after: t)...].prefix(8)) }
        let level = (object["level"] as? String ?? "").padding(toLength: 5, withPad: " ", startingAt: 0)
        var text = "[\(prefix)] \(time) \(level) \(message)"
        for key in object.keys.sorted() where !["ts", "level", "logger", "msg"].contains(key) {
            text += " \(key)=\(render(object[key]!))"
        }
        return text
    }

    private static func render(_ value: Any) -> String {
        switch value {
        case let string as String:
            return string.isEmpty || string.contains(where: { $0 == " " || $0 == "=" || $0 == "\"" })
                ? "\"" + string.replacingOccurrences(of: "\"", with: "\\\"") + "\"" : string
        default:
            return "\(value)"
        }
    }
}

/// Serialises whole lines from several reader threads onto stdout.
final class DevOutput: Sendable {
    /// Lines written so far. (Not `Locked(())`: ThreadSanitizer confuses a zero-size value's
    /// accesses with the lock's own field and reports a race that is not there.)
    private let linesWritten = Locked(0)
    private let closed = Locked(false)

    /// True once a write found no reader (EPIPE): `siwa dev` then stops.
    var isClosed: Bool { closed.withLock { $0 } }

    func line(_ text: String) {
        let bytes = Array((text + "\n").utf8)
        linesWritten.withLock { count in
            // write(2), not FileHandle: FileHandle traps on EPIPE, and a closed pipe must stop the
            // stack in order instead.
            var offset = 0
            while offset < bytes.count {
                let written = bytes[offset...].withUnsafeBytes { Glibc.write(1, $0.baseAddress, $0.count) }
                if written < 0 && errno == EINTR { continue }
                if written <= 0 {
                    if errno == EPIPE { closed.withLock { $0 = true } }
                    return
                }
                offset += written
            }
            count += 1
        }
    }
}
