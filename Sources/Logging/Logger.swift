#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Foundation

/// A small structured logger whose API is a subset of swift-log's, so adopting swift-log later only
/// swaps the dependency. Every record is one JSON object on one line of stderr.
///
/// Secrets never go in here: callers pass identifiers (`job.id`, `client_id`), never tokens, codes,
/// client secrets or keys. `LogSink` exists so tests can capture every line and check that.
public struct Logger: Sendable {
    public enum Level: Int, Sendable, Comparable, CaseIterable, CustomStringConvertible {
        case trace = 0, debug, info, notice, warning, error, critical

        public static func < (lhs: Level, rhs: Level) -> Bool { lhs.rawValue < rhs.rawValue }

        /// Parses the `SIWA_LOG_LEVEL` spellings (`debug`, `info`, `warn`, `error`) and swift-log's names.
        public init?(configurationValue: String) {
            switch configurationValue.lowercased() {
            case "trace": self = .trace
            case "debug": self = .debug
            case "info": self = .info
            case "notice": self = .notice
            case "warn", "warning": self = .warning
            case "error": self = .error
            case "critical": self = .critical
            default: return nil
            }
        }

        public var description: String {
            switch self {
            case .trace: "trace"
            case .debug: "debug"
            case .info: "info"
            case .notice: "notice"
            case .warning: "warn"
            case .error: "error"
            case .critical: "critical"
            }
        }
    }

    public enum MetadataValue: Sendable, ExpressibleByStringLiteral, ExpressibleByStringInterpolation,
        CustomStringConvertible
    {
        case string(String)
        case int(Int)
        case double(Double)
        case bool(Bool)

        public init(stringLiteral value: String) { self = .string(value) }
        public var description: String {
            switch self {
            case .string(let value): value
            case .int(let value): String(value)
            case .double(let value): String(value)
            case .bool(let value): String(value)
            }
        }
    }

    public typealias Metadata = [String: MetadataValue]

    public let label: String
    public var logLevel: Level
    public var metadata: Metadata
    private let sink: LogSink

    public init(label: String, level: Level = .info, metadata: Metadata = [:], sink: LogSink = .standardError) {
        self.label = label
        self.logLevel = level
        self.metadata = metadata
        self.sink = sink
    }

    public subscript(metadataKey key: String) -> MetadataValue? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    /// A copy with extra metadata, for handing a request- or job-scoped logger down.
    public func with(_ extra: Metadata) -> Logger {
        var copy = self
        copy.metadata.merge(extra) { _, new in new }
        return copy
    }

    public func log(
        level: Level, _ message: @autoclosure () -> String, metadata extra: @autoclosure () -> Metadata? = nil
    ) {
        guard level >= logLevel else { return }
        var fields = metadata
        if let extra = extra() { fields.merge(extra) { _, new in new } }
        sink.write(Logger.render(level: level, label: label, message: message(), metadata: fields))
    }

    public func trace(_ message: @autoclosure () -> String, metadata: @autoclosure () -> Metadata? = nil) {
        log(level: .trace, message(), metadata: metadata())
    }
    public func debug(_ message: @autoclosure () -> String, metadata: @autoclosure () -> Metadata? = nil) {
        log(level: .debug, message(), metadata: metadata())
    }
    public func info(_ message: @autoclosure () -> String, metadata: @autoclosure () -> Metadata? = nil) {
        log(level: .info, message(), metadata: metadata())
    }
    public func notice(_ message: @autoclosure () -> String, metadata: @autoclosure () -> Metadata? = nil) {
        log(level: .notice, message(), metadata: metadata())
    }
    public func warning(_ message: @autoclosure () -> String, metadata: @autoclosure () -> Metadata? = nil) {
        log(level: .warning, message(), metadata: metadata())
    }
    public func error(_ message: @autoclosure () -> String, metadata: @autoclosure () -> Metadata? = nil) {
        log(level: .error, message(), metadata: metadata())
    }
    public func critical(_ message: @autoclosure () -> String, metadata: @autoclosure () -> Metadata? = nil) {
        log(level: .critical, message(), metadata: metadata())
    }

    /// One JSON object: `ts`, `level`, `logger`, `msg`, then the metadata keys in sorted order.
    static func render(level: Level, label: String, message: String, metadata: Metadata) -> String {
        var line = "{\"ts\":\"\(timestamp())\",\"level\":\"\(level)\",\"logger\":"
        appendJSONString(label, to: &line)
        line += ",\"msg\":"
        appendJSONString(message, to: &line)
        for key in metadata.keys.sorted() where !["ts", "level", "logger", "msg"].contains(key) {
            line += ","
            appendJSONString(key, to: &line)
            line += ":"
            switch metadata[key]! {
            case .string(let value): appendJSONString(value, to: &line)
            case .int(let value): line += String(value)
            case .double(let value): line += value.isFinite ? String(value) : "null"
            case .bool(let value): line += value ? "true" : "false"
            }
        }
        line += "}\n"
        return line
    }

    private static func timestamp() -> String {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        var seconds = now.tv_sec
        var parts = tm()
        gmtime_r(&seconds, &parts)
        let millis = Int(now.tv_nsec) / 1_000_000
        func pad(_ value: Int32, _ width: Int) -> String {
            let text = String(value)
            return String(repeating: "0", count: max(0, width - text.count)) + text
        }
        return "\(pad(parts.tm_year + 1900, 4))-\(pad(parts.tm_mon + 1, 2))-\(pad(parts.tm_mday, 2))T"
            + "\(pad(parts.tm_hour, 2)):\(pad(parts.tm_min, 2)):\(pad(parts.tm_sec, 2)).\(pad(Int32(millis), 3))Z"
    }

    static func appendJSONString(_ value: String, to output: inout String) {
        output += "\""
        for scalar in value.unicodeScalars {
            switch scalar {
            case "\"": output += "\\\""
            case "\\": output += "\\\\"
            case "\n": output += "\\n"
            case "\r": output += "\\r"
            case "\t": output += "\\t"
            case _ where scalar.value < 0x20:
                let hex = String(scalar.value, radix: 16)
                output += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default: output.unicodeScalars.append(scalar)
            }
        }
        output += "\""
    }
}

/// Where rendered lines go. Standard error by default; a file descriptor for tests and tools.
public struct LogSink: Sendable {
    private let fileDescriptor: Int32

    public static let standardError = LogSink(fileDescriptor: 2)

    public init(fileDescriptor: Int32) { self.fileDescriptor = fileDescriptor }

    /// One `write(2)` per line so lines from different threads never interleave mid-line.
    func write(_ line: String) {
        var bytes = Array(line.utf8)
        var offset = 0
        while offset < bytes.count {
            let written = bytes.withUnsafeMutableBytes { buffer in
                Foundation.write(fileDescriptor, buffer.baseAddress! + offset, buffer.count - offset)
            }
            if written < 0 {
                if errno == EINTR { continue }
                return
            }
            offset += written
        }
        bytes.removeAll()
    }
}
