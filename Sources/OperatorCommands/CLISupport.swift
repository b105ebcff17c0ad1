import Foundation
import Logging
import Postgres
import Settings

/// Helpers the database commands share: one-line errors, settings, connection, formatting.
enum CLI {
    /// Writes `siwa <command>: <message>` as one stderr line.
    static func error(_ command: String, _ message: String) {
        let line = message.split(separator: "\n", omittingEmptySubsequences: true).first.map(String.init) ?? message
        FileHandle.standardError.write(Data("siwa \(command): \(line)\n".utf8))
    }

    static func warn(_ message: String) {
        FileHandle.standardError.write(Data("warning: \(message)\n".utf8))
    }

    /// `DATABASE_URL` and the log level, checked before anything runs; unknown flags are errors.
    /// Returns nil after printing the one-line error (the caller exits 2).
    static func databaseSettings(
        _ command: String, _ source: ConfigurationSource, options: [String] = []
    ) -> (url: String, logger: Logger)? {
        let variables = ["DATABASE_URL", "SIWA_LOG_LEVEL"]
        let known = variables + variables.map { $0 + "_FILE" } + options.map { $0.uppercased() }
        if let unknown = source.unknownFlags(known: known).first {
            error(command, "--\(unknown): unknown option")
            return nil
        }
        do {
            let url = try CommonSettings.databaseURL(source)
            let settings = try CommonSettings(source)
            return (url, Logger(label: "siwa-\(command)", level: settings.logLevel))
        } catch {
            self.error(command, "\(error)")
            return nil
        }
    }

    static func connect(_ command: String, url: String, logger: Logger) async -> PostgresConnection? {
        do {
            return try await PostgresConnection.connect(to: url, applicationName: "siwa-\(command)", logger: logger)
        } catch {
            self.error(command, databaseProblem(error))
            return nil
        }
    }

    /// A database error as one sentence for a person: an unreachable server is said so, with
    /// libpq's reason (`connection to server at "db", port 5432 failed: Connection refused`) and
    /// without the error type's dump; anything else is its first line.
    static func databaseProblem(_ error: any Error) -> String {
        guard let error = error as? PostgresError, error.code == .connectionFailed || error.code == .connectionLost else {
            return oneLine(error)
        }
        let reason = error.message.split(separator: "\n", omittingEmptySubsequences: true).first
            .map { $0.trimmingCharacters(in: .whitespaces) } ?? ""
        return "cannot reach the database DATABASE_URL names" + (reason.isEmpty ? "" : " (\(reason))")
    }

    static func oneLine(_ error: any Error) -> String {
        let text = "\(error)".trimmingCharacters(in: .whitespacesAndNewlines)
        return text.split(separator: "\n", omittingEmptySubsequences: true).first.map(String.init) ?? text
    }

    /// `4s`, `2m 05s`, `3h 02m`, `2d 04h`.
    static func age(_ seconds: Double) -> String {
        let total = max(0, Int(seconds.rounded()))
        switch total {
        case ..<60: return "\(total)s"
        case ..<3600: return "\(total / 60)m \(String(format: "%02d", total % 60))s"
        case ..<86_400: return "\(total / 3600)h \(String(format: "%02d", total % 3600 / 60))m"
        default: return "\(total / 86_400)d \(String(format: "%02d", total % 86_400 / 3600))h"
        }
    }

    static func iso8601(_ date: Date) -> String {
        date.formatted(.iso8601)
    }

    /// Columns padded to their widest cell; numbers (and headers over them) right-aligned.
    static func table(_ rows: [[String]], rightAligned: Set<Int> = []) -> String {
        guard let width = rows.map(\.count).max() else { return "" }
        var widths = [Int](repeating: 0, count: width)
        for row in rows { for (index, cell) in row.enumerated() { widths[index] = max(widths[index], cell.count) } }
        return rows.map { row in
            row.enumerated().map { index, cell in
                let pad = String(repeating: " ", count: widths[index] - cell.count)
                return rightAligned.contains(index) ? pad + cell : cell + pad
            }.joined(separator: "  ")
        }.map { String($0.reversed().drop(while: { $0 == " " }).reversed()) }.joined(separator: "\n")
    }

    /// Compact JSON with sorted keys (stable for scripts), one line.
    static func json(_ value: Any) -> String {
        guard let data = try? JSONSerialization.data(withJSONObject: value, options: [.sortedKeys, .withoutEscapingSlashes])
        else { return "{}" }
        return String(decoding: data, as: UTF8.self)
    }
}
