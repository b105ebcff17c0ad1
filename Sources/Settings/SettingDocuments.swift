/// The documents made from `SettingCatalog`: the README's table, the systemd example file and the
/// settings part of each program's usage. Tests compare the committed files with these.
package enum SettingDocuments {
    /// Lines around the generated table in README.md.
    package static let tableBegin = "<!-- settings:begin (generated: swift run siwa config-reference --markdown) -->"
    package static let tableEnd = "<!-- settings:end -->"

    /// The README's configuration table (without the markers).
    package static func markdownTable(_ settings: [Setting] = SettingCatalog.all) -> String {
        var lines = ["| variable | used by | default | meaning |", "| --- | --- | --- | --- |"]
        for setting in settings {
            lines.append("| `\(setting.name)` | \(setting.readersText) | \(setting.defaultText) | \(setting.meaning) |")
        }
        return lines.joined(separator: "\n") + "\n"
    }

    /// `deploy/systemd/siwa.env.example`: every setting the receiver or the worker reads.
    package static func environmentExample(_ settings: [Setting] = SettingCatalog.all) -> String {
        var text = environmentHeader
        let sections: [(String, (Setting) -> Bool)] = [
            ("all", { $0.readers.isEmpty }),
            ("receiver and worker", { !$0.readers.isEmpty && $0.isRead(by: .receiver) && $0.isRead(by: .worker) }),
            ("receiver", { !$0.readers.isEmpty && $0.isRead(by: .receiver) && !$0.isRead(by: .worker) }),
            ("worker", { !$0.readers.isEmpty && $0.isRead(by: .worker) && !$0.isRead(by: .receiver) }),
        ]
        for (title, belongs) in sections {
            text += "\n# --- \(title) " + String(repeating: "-", count: max(3, 93 - title.count)) + "\n"
            for setting in settings where belongs(setting) {
                text += "\n" + commentBlock(setting)
            }
        }
        return text
    }

    private static func commentBlock(_ setting: Setting) -> String {
        var sentences = [plainText(setting.meaning).capitalizedFirst + "."]
        sentences.append("Default: " + plainText(setting.defaultText).trimmingPrefix("; ") + ".")
        if setting.isSecret {
            sentences.append("A secret: give it as a credential file (\(setting.name)_FILE), never set it here.")
        }
        if let note = setting.deployNote { sentences.append(note) }
        var text = wrap(setting.name + ": " + sentences.joined(separator: " "), width: 98, prefix: "# ")
        if let example = setting.exampleValue {
            text += "\(setting.name)=\(example)\n"
        } else {
            text += "#\(setting.name)=\(setting.isSecret ? "" : setting.defaultValue ?? "")\n"
        }
        return text
    }

    private static let environmentHeader = """
        # /etc/siwa/siwa.env — configuration of siwa-receiver, siwa-worker@N and siwa-migrate.
        # Install: install -d -m 0755 /etc/siwa && install -m 0640 siwa.env.example /etc/siwa/siwa.env
        # Generated from the settings in the code: swift run siwa config-reference --env
        #
        # systemd EnvironmentFile syntax: KEY=value, one per line, '#' starts a comment line.
        # Every variable the receiver and the worker read is listed; a commented-out line shows the
        # default. A missing or invalid value makes the program exit with status 2 and one line on
        # stderr naming the variable (the units do not restart on status 2: check `journalctl -u ...`).
        #
        # No secrets in this file. Secrets are files in /etc/siwa/credentials/ (root:root, 0600), given
        # to each service by systemd's LoadCredential= and named by the *_FILE variables the units set:
        #   migrate-database-url   -> siwa-migrate   DATABASE_URL_FILE      (database owner)
        #   receiver-database-url  -> siwa-receiver  DATABASE_URL_FILE      (a login in role siwa_receiver)
        #   worker-database-url    -> siwa-worker@N  DATABASE_URL_FILE      (a login in role siwa_worker)
        #   apple-key.p8           -> siwa-worker@N  SIWA_PRIVATE_KEY_FILE
        #   token-keys             -> siwa-worker@N  SIWA_TOKEN_KEYS_FILE
        #   webhook-secret         -> siwa-worker@N  SIWA_WEBHOOK_SECRET_FILE (when webhooks are sent)
        #   app-api-tokens         -> siwa-worker@N  SIWA_APP_API_TOKENS_FILE (when the app API is served)
        # Settings in this file override the units' Environment= lines, so do NOT set DATABASE_URL,
        # DATABASE_URL_FILE, SIWA_TOKEN_KEYS, SIWA_TOKEN_KEYS_FILE, SIWA_PRIVATE_KEY_FILE or
        # SIWA_OPS_LISTEN here. `siwa dev`'s own settings (SIWA_DEV_*) are in the README.

        """

    /// `siwa-receiver --help` / `siwa-worker --help`: what it is and every setting it reads.
    package static func programHelp(_ program: String, about: String, reader: Setting.Reader) -> String {
        "usage: \(program) [--setting-name value ...]\n\n" + wrap(about, width: 100, prefix: "") + "\n"
            + usage(readBy: reader)
    }

    /// True when the command line asks for help (`--help`, `-h`): print it and start nothing.
    package static func asksForHelp(_ arguments: [String]) -> Bool {
        arguments.contains("--help") || arguments.contains("-h")
    }

    /// The settings part of a program's `--help`: name, default, meaning, wrapped for a terminal.
    package static func usage(readBy reader: Setting.Reader) -> String {
        usage(SettingCatalog.all.filter { $0.isRead(by: reader) })
    }

    package static func usage(_ settings: [Setting]) -> String {
        var text = "settings (environment variables; each also a --kebab-case flag, or NAME_FILE naming a file):\n"
        for setting in settings {
            text += "  \(setting.name)  [\(plainText(setting.defaultText).trimmingPrefix("; "))]\n"
            text += wrap(plainText(setting.meaning), width: 100, prefix: "      ")
        }
        return text
    }

    /// Words joined into lines of at most `width` characters (a longer word gets a line of its own).
    package static func wrap(_ text: String, width: Int, prefix: String) -> String {
        var lines: [String] = []
        var line = ""
        for word in text.split(separator: " ") {
            if !line.isEmpty, prefix.count + line.count + 1 + word.count > width {
                lines.append(line)
                line = ""
            }
            line += (line.isEmpty ? "" : " ") + word
        }
        if !line.isEmpty { lines.append(line) }
        return lines.map { prefix + $0 + "\n" }.joined()
    }
}

extension String {
    fileprivate var capitalizedFirst: String { prefix(1).uppercased() + dropFirst() }

    fileprivate func trimmingPrefix(_ prefix: String) -> String { hasPrefix(prefix) ? String(dropFirst(prefix.count)) : self }
}
