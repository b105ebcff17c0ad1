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
    /// The settings it reads: those of `reader`, plus `extraSettings`, less `unusedSettings`.
    var reader: Setting.Reader?
    var extraSettings: [String] = []
    /// Settings every program reads that this command does not (`siwa simulate` opens no database).
    var unusedSettings: [String] = []
    /// What the default column says for this command where it differs from the catalog's: `siwa
    /// dev` makes the Apple credentials, so they are not "required" there.
    var defaultsHere: [String: String] = [:]
    /// Anything else worth saying (examples, endpoints), printed last.
    var notes: String?
    /// How many words may follow the command (`siwa jobs retry 12` has two); a further one is a
    /// stray argument, refused with exit status 2 before the command runs.
    var arguments: Arguments = .none

    /// The words after the command name that are not flags.
    enum Arguments: Sendable {
        case none
        /// At most this many (`siwa simulate TYPE`).
        case upTo(Int)
        /// The first word is an action; each allows this many words in all, itself included. An
        /// unknown action is the command's own to refuse (it names the actions).
        case actions([String: Int])

        /// The first word past what is allowed, if any.
        func stray(in words: [String]) -> String? {
            let allowed: Int
            switch self {
            case .none: allowed = 0
            case .upTo(let count): allowed = count
            case .actions(let counts): allowed = words.first.flatMap { counts[$0] } ?? words.count
            }
            return words.count > allowed ? words[allowed] : nil
        }
    }

    var settings: [Setting] {
        SettingCatalog.all.filter { setting in
            (reader.map { setting.isRead(by: $0) } == true || extraSettings.contains(setting.name))
                && !unusedSettings.contains(setting.name)
        }.map { setting in
            guard let text = defaultsHere[setting.name] else { return setting }
            var here = setting
            (here.defaultValue, here.defaultNote) = (nil, text)
            return here
        }
    }

    var switches: Set<String> { Set(options.filter { $0.value == nil }.map(\.name)) }

    /// Every flag it takes that carries a value, without the dashes: its options and its settings
    /// (and their `_FILE` forms), each also accepted as `--flag=value`.
    var valueFlags: Set<String> { Set(knownVariables.map(ConfigurationSource.flagName(for:))).subtracting(switches) }

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
