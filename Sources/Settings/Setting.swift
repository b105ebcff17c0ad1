import Foundation

/// One environment variable: what reads it, its default and what it means. `SettingCatalog.all`
/// lists every one; the README's configuration table, `deploy/systemd/siwa.env.example`, each
/// program's `--help` and each program's list of accepted flags are made from it, so a setting is
/// added in one place (and a test fails when the committed documents fall behind).
package struct Setting: Sendable, Equatable {
    /// The programs (and `siwa` commands) that read a setting.
    package enum Reader: String, Sendable, CaseIterable, Comparable {
        case receiver, worker
        case dev = "`siwa dev`"
        case accounts = "`siwa accounts`"
        case webhooks = "`siwa webhooks`"
        case simulate = "`siwa simulate`"
        case console = "`siwa console`"
        /// Every `siwa` command that opens the database (`migrate`, `status`, `jobs`, ...).
        case databaseCommands = "`siwa` database commands"

        package static func < (lhs: Reader, rhs: Reader) -> Bool {
            allCases.firstIndex(of: lhs)! < allCases.firstIndex(of: rhs)!
        }
    }

    package var name: String
    /// Empty: every program.
    package var readers: Set<Reader>
    /// The value used when unset, as typed (`0.0.0.0:8080`); nil when there is none.
    package var defaultValue: String?
    /// What the default column adds: `required`, `unset: no webhooks`, `(siwa dev: ...)`. Markdown.
    package var defaultNote: String?
    /// Markdown, one sentence or a few.
    package var meaning: String
    /// A secret: documented as given through `NAME_FILE`, never set in the example file.
    package var isSecret: Bool
    /// Set (not commented out) in the systemd example, with this value.
    package var exampleValue: String?
    /// An extra line for the systemd example (who sets it there).
    package var deployNote: String?

    package init(
        _ name: String, _ readers: Set<Reader>, default defaultValue: String? = nil, note defaultNote: String? = nil,
        secret isSecret: Bool = false, example exampleValue: String? = nil, deploy deployNote: String? = nil,
        _ meaning: String
    ) {
        self.name = name
        self.readers = readers
        self.defaultValue = defaultValue
        self.defaultNote = defaultNote
        self.meaning = meaning
        self.isSecret = isSecret
        self.exampleValue = exampleValue
        self.deployNote = deployNote
    }

    package func isRead(by reader: Reader) -> Bool { readers.isEmpty || readers.contains(reader) }

    /// `all`, or the readers in a fixed order: `receiver, worker, `siwa dev``.
    package var readersText: String {
        readers.isEmpty ? "all" : readers.sorted().map(\.rawValue).joined(separator: ", ")
    }

    /// The default column: `` `4` ``, `` `0.0.0.0:8080` (siwa dev: ...) ``, `required ...`.
    package var defaultText: String {
        switch (defaultValue, defaultNote) {
        case (let value?, let note?): return "`\(value)`" + (note.hasPrefix(";") ? "" : " ") + note
        case (let value?, nil): return "`\(value)`"
        case (nil, let note?): return note
        case (nil, nil): return "unset"
        }
    }

    /// The `--kebab-case` flag that sets it.
    package var flag: String { "--" + ConfigurationSource.flagName(for: name) }
}

/// Markdown made readable in a terminal or a comment: no backticks, `\|` as `|`, links as text.
package func plainText(_ markdown: String) -> String {
    var text = markdown.replacingOccurrences(of: "`", with: "").replacingOccurrences(of: "\\|", with: "|")
    while let open = text.range(of: "]("), let close = text[open.upperBound...].firstIndex(of: ")") {
        text.removeSubrange(open.lowerBound...close)
    }
    return text.replacingOccurrences(of: "[", with: "")
}
