import Foundation
import Settings

/// What `siwa help COMMAND`, `siwa COMMAND --help` and `-h` print, and what the command accepts:
/// a flag not listed here (nor a setting it reads) is refused with exit status 2 before it runs.
struct CommandUsage: Sendable {
    /// One flag of the command itself (never read from the environment).
    struct Option: Sendable {
        /// Without the dashes: `state` for `--state`.
        var name: String
        /// The value's placeholder (`S`); nil for a flag that takes none (`--json`).
        var value: String?
        var meaning: String
        var defaultText: String?

        init(_ name: String, _ value: String?, _ meaning: String, default defaultText: String? = nil) {
            self.name = name
            self.value = value
            self.meaning = meaning
            self.defaultText = defaultText
        }

        /// A flag that takes no value.
        init(_ name: String, _ meaning: String) {
            self.init(name, nil, meaning)
        }
    }

    /// `siwa jobs list [--state S] ...`, one line per form.
    var synopsis: [String]
    var about: String
    var options: [Option] = []
    /// The settings it reads: those of `reader`, plus `extraSettings`.
    var reader: Setting.Reader?
    var extraSettings: [String] = []
    /// Anything else worth saying (examples, endpoints), printed last.
    var notes: String?

    var settings: [Setting] {
        SettingCatalog.all.filter { setting in
            reader.map { setting.isRead(by: $0) } == true || extraSettings.contains(setting.name)
        }
    }

    var switches: Set<String> { Set(options.filter { $0.value == nil }.map(\.name)) }

    /// Names `ConfigurationSource.unknownFlags(known:)` takes: each option and setting, and the
    /// settings' `_FILE` forms.
    var knownVariables: [String] {
        options.map { $0.name.uppercased().replacingOccurrences(of: "-", with: "_") }
            + settings.flatMap { [$0.name, $0.name + "_FILE"] }
    }

    func text() -> String {
        var text = "usage: " + synopsis.joined(separator: "\n       ") + "\n\n"
        text += SettingDocuments.wrap(about, width: 100, prefix: "") + "\n"
        if !options.isEmpty {
            text += "flags:\n"
            let width = min(30, options.map { flagText($0).count }.max() ?? 0)
            for option in options {
                let flag = flagText(option)
                let padded = flag + String(repeating: " ", count: max(1, width - flag.count + 2))
                let meaning = option.meaning + (option.defaultText.map { " (default: \($0))" } ?? "")
                if flag.count > width {
                    text += "  \(flag)\n" + SettingDocuments.wrap(meaning, width: 100, prefix: String(repeating: " ", count: width + 4))
                } else {
                    let wrapped = SettingDocuments.wrap(meaning, width: 100 - width - 4, prefix: "")
                    let lines = wrapped.split(separator: "\n")
                    text += "  \(padded)\(lines.first ?? "")\n"
                    for line in lines.dropFirst() { text += String(repeating: " ", count: width + 4) + line + "\n" }
                }
            }
            text += "  -h, --help" + String(repeating: " ", count: max(1, width + 2 - 10)) + "this text\n\n"
        }
        let settings = settings
        if !settings.isEmpty { text += SettingDocuments.usage(settings) + "\n" }
        if let notes { text += notes.hasSuffix("\n") ? notes : notes + "\n" }
        return text
    }

    private func flagText(_ option: Option) -> String {
        "--\(option.name)" + (option.value.map { " \($0)" } ?? "")
    }
}
