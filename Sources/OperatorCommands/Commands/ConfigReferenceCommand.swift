import Settings

/// `siwa config-reference --markdown | --env`: the README's configuration table and
/// `deploy/systemd/siwa.env.example`, as the settings in the code define them. Not listed by
/// `siwa help`: it is how those documents are regenerated after a setting is added.
enum ConfigReferenceCommand: CLICommand {
    static let name = "config-reference"
    static let summary = "print the configuration table (--markdown) or the systemd example file (--env)"
    static let usage = CommandUsage(
        synopsis: ["siwa config-reference --markdown | --env"],
        about: "Prints the README's configuration table (between its settings markers) or deploy/systemd/siwa.env.example, "
            + "made from the settings defined in the code.",
        options: [
            .init("markdown", nil, "the README table"),
            .init("env", nil, "the systemd example file"),
        ])

    static func run(_ source: ConfigurationSource) async -> Int32 {
        switch (source.isSet(switch: "markdown"), source.isSet(switch: "env")) {
        case (true, false): print(SettingDocuments.markdownTable(), terminator: "")
        case (false, true): print(SettingDocuments.environmentExample(), terminator: "")
        default:
            CLI.error(name, "give one of --markdown or --env")
            return 2
        }
        return 0
    }
}
