import Foundation

/// A missing or invalid setting. Executables print `description` as their one stderr line and
/// exit with status 2, before anything is started.
package struct ConfigurationError: Error, CustomStringConvertible, Equatable {
    package var variable: String
    package var problem: String

    package init(variable: String, problem: String) {
        self.variable = variable
        self.problem = problem
    }

    package var description: String { "\(variable): \(problem)" }
}

/// Settings from the environment, each also accepted as a `--kebab-case` flag (the flag wins):
/// `DATABASE_URL` is `--database-url`. Anything else on the command line is positional.
///
/// A variable `X` may also be given as `X_FILE`, the path of a file holding the value (systemd's
/// `LoadCredential`, Kubernetes secret volumes), so secrets need not sit in the environment.
package struct ConfigurationSource: Sendable {
    package private(set) var positional: [String] = []
    private var flags: [String: String] = [:]
    private var switches: Set<String> = []
    private var environment: [String: String]
    /// Set by `withoutEnvironment()`: errors then name the flag (`--client-id`), the only way in.
    private var namesFlags = false

    /// - Parameters:
    ///   - booleanFlags: flags that take no value (`--json`).
    ///   - knownFlags: when given, every flag the program takes (without dashes, `booleanFlags`
    ///     included): any other is refused here, before it could swallow the next word as its value
    ///     (`--jsn` would otherwise read as "expects a value").
    package init(
        arguments: [String], environment: [String: String] = ProcessInfo.processInfo.environment,
        booleanFlags: Set<String> = [], knownFlags: Set<String>? = nil
    ) throws(ConfigurationError) {
        self.environment = environment
        var index = 0
        while index < arguments.count {
            let argument = arguments[index]
            index += 1
            guard argument.hasPrefix("--"), argument.count > 2 else {
                positional.append(argument)
                continue
            }
            let body = argument.dropFirst(2)
            let name = String(body.prefix { $0 != "=" })
            if let knownFlags, !knownFlags.contains(name), !booleanFlags.contains(name) {
                throw ConfigurationError(variable: "--" + name, problem: "unknown option")
            }
            if let equals = body.firstIndex(of: "=") {
                if booleanFlags.contains(name) {
                    throw ConfigurationError(variable: "--" + name, problem: "takes no value (write --\(name) alone)")
                }
                flags[name] = String(body[body.index(after: equals)...])
            } else if booleanFlags.contains(String(body)) {
                switches.insert(String(body))
            } else {
                guard index < arguments.count else {
                    throw ConfigurationError(variable: argument, problem: "expects a value")
                }
                flags[String(body)] = arguments[index]
                index += 1
            }
        }
    }

    package static func flagName(for variable: String) -> String {
        variable.lowercased().replacingOccurrences(of: "_", with: "-")
    }

    /// Flags given that no lookup asked for: caught so a typo is an error, not a silent default.
    package func unknownFlags(known variables: [String]) -> [String] {
        let knownFlags = Set(variables.map(Self.flagName(for:)))
        return flags.keys.filter { !knownFlags.contains($0) }.sorted()
    }

    /// Throws for the first flag that names none of `variables` (nor their `X_FILE` forms), so a
    /// typo is exit status 2, not a silent default.
    package func rejectUnknownFlags(_ variables: [String]) throws(ConfigurationError) {
        if let unknown = unknownFlags(known: variables + variables.map { $0 + "_FILE" }).first {
            throw ConfigurationError(variable: "--\(unknown)", problem: "unknown option")
        }
    }

    /// How errors name `variable`: the variable, or its flag for a command's own options.
    private func label(_ variable: String) -> String {
        namesFlags ? "--" + Self.flagName(for: variable) : variable
    }

    package func isSet(switch name: String) -> Bool { switches.contains(name) }

    /// The same command line with no environment behind it: for a command's own flags (`--sub`,
    /// `--listen`), which must never be picked up from a variable that happens to be set (`SUB`).
    package func withoutEnvironment() -> ConfigurationSource {
        var copy = self
        copy.environment = [:]
        copy.namesFlags = true
        return copy
    }

    /// A command's own option (`--state S` for `siwa jobs list`), from the command line only: never
    /// from the environment, where a variable named `STATE` could otherwise leak in.
    package func option(_ name: String) -> String? {
        guard let value = flags[name], !value.isEmpty else { return nil }
        return value
    }

    /// The raw value: from the command line (`--x` or `--x-file`), else from the environment (`X` or
    /// `X_FILE`; a file's trailing newline trimmed). Empty counts as unset. Giving both `X` and
    /// `X_FILE` in the same place is an error, not a silent choice: one of them is a mistake, and
    /// it may be the secret the operator meant to use. An unreadable or empty file is an error too.
    package func string(_ variable: String) throws(ConfigurationError) -> String? {
        let fileVariable = variable + "_FILE"
        let layers: [(value: String?, path: String?)] = [
            (flags[Self.flagName(for: variable)], flags[Self.flagName(for: fileVariable)]),
            (environment[variable], environment[fileVariable]),
        ]
        for layer in layers {
            let value = layer.value.flatMap { $0.isEmpty ? nil : $0 }
            let path = layer.path.flatMap { $0.isEmpty ? nil : $0 }
            switch (value, path) {
            case (nil, nil): continue
            case (let value?, nil): return value
            case (nil, let path?): return try Self.read(path, for: fileVariable)
            case (_?, _?): throw ConfigurationError(variable: label(variable), problem: "is set together with \(fileVariable); set one of them")
            }
        }
        return nil
    }

    private static func read(_ path: String, for fileVariable: String) throws(ConfigurationError) -> String {
        guard let data = FileManager.default.contents(atPath: path), let text = String(data: data, encoding: .utf8) else {
            throw ConfigurationError(variable: fileVariable, problem: "cannot read \(path)")
        }
        let trimmed = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard !trimmed.isEmpty else { throw ConfigurationError(variable: fileVariable, problem: "\(path) is empty") }
        return trimmed
    }

    package func require(_ variable: String) throws(ConfigurationError) -> String {
        guard let value = try string(variable) else {
            throw ConfigurationError(variable: label(variable), problem: "is required")
        }
        return value
    }

    package func integer(_ variable: String, default fallback: Int, range: ClosedRange<Int>) throws(ConfigurationError)
        -> Int
    {
        guard let text = try string(variable) else { return fallback }
        guard let value = Int(text), range.contains(value) else {
            throw ConfigurationError(
                variable: label(variable),
                problem: "expected a whole number from \(range.lowerBound) to \(range.upperBound), got \"\(text)\"")
        }
        return value
    }

    package func listenAddress(_ variable: String, default fallback: String) throws(ConfigurationError)
        -> ListenAddress
    {
        let text = try string(variable) ?? fallback
        guard let address = ListenAddress(text) else {
            throw ConfigurationError(variable: label(variable), problem: "expected host:port (e.g. 0.0.0.0:8080), got \"\(text)\"")
        }
        return address
    }

    /// `500ms`, `1s`, `2m`, `1h`, `7d`, or a bare number of seconds, within `range`.
    package func duration(_ variable: String, default fallback: Duration, range: ClosedRange<Duration>)
        throws(ConfigurationError) -> Duration
    {
        guard let text = try string(variable) else { return fallback }
        guard let value = Self.parseDuration(text), range.contains(value) else {
            throw ConfigurationError(
                variable: label(variable), problem: "expected a duration like 500ms, 30s, 5m, 7d (within \(range)), got \"\(text)\"")
        }
        return value
    }

    /// `500ms`, `1s`, `2m`, `1h`, `7d`, or a bare number of seconds; nil for anything else,
    /// including values too large to count in milliseconds.
    package static func parseDuration(_ text: String) -> Duration? {
        let units: [(String, Double)] = [("ms", 0.001), ("s", 1), ("m", 60), ("h", 3600), ("d", 86_400)]
        var number = Substring(text)
        var scale = 1.0
        for (suffix, unitScale) in units where text.hasSuffix(suffix) {
            if suffix == "s", text.dropLast().hasSuffix("m") { continue }
            number = text.dropLast(suffix.count)
            scale = unitScale
            break
        }
        guard let value = Double(number), value >= 0, value.isFinite else { return nil }
        let milliseconds = (value * scale * 1000).rounded()
        guard milliseconds < 1e15 else { return nil }  // ~31,000 years: far past any range, still exact
        return .milliseconds(Int64(milliseconds))
    }

    /// Comma-separated, trimmed, non-empty items.
    package func list(_ variable: String) throws(ConfigurationError) -> [String]? {
        guard let text = try string(variable) else { return nil }
        let items = text.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        return items.isEmpty ? nil : items
    }
}

/// `host:port` for a listener. IPv6 hosts are written in brackets: `[::1]:8080`.
package struct ListenAddress: Sendable, Equatable, CustomStringConvertible {
    package var host: String
    package var port: Int

    package init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    package init?(_ text: String) {
        guard let colon = text.lastIndex(of: ":") else { return nil }
        var host = String(text[..<colon])
        guard let port = Int(text[text.index(after: colon)...]), (0...65535).contains(port), !host.isEmpty else {
            return nil
        }
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        self.host = host
        self.port = port
    }

    package var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}
