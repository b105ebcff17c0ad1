import Foundation
import Testing
import Settings

/// The settings defined in the code (`SettingCatalog`) against what is written down: the
/// configuration reference's table between its markers (deploy/README.md), `deploy/systemd/siwa.env.example`, and the variables the code reads.
/// Regenerate with `swift run siwa config-reference --markdown` / `--env`.
@Suite struct SettingDocumentsTests {
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    static func read(_ path: String) throws -> String {
        try String(contentsOf: repository.appendingPathComponent(path), encoding: .utf8)
    }

    @Test func referenceTableIsTheGeneratedOne() throws {
        let reference = try Self.read("deploy/README.md")
        let begin = try #require(reference.range(of: SettingDocuments.tableBegin), "deploy/README.md lacks the settings:begin marker")
        let end = try #require(reference.range(of: SettingDocuments.tableEnd), "deploy/README.md lacks the settings:end marker")
        let block = reference[begin.upperBound..<end.lowerBound].trimmingCharacters(in: .newlines) + "\n"
        #expect(
            block == SettingDocuments.markdownTable(), "deploy/README.md's table is stale: swift run siwa config-reference --markdown")
    }

    @Test func systemdExampleIsTheGeneratedOne() throws {
        let example = try Self.read("deploy/systemd/siwa.env.example")
        #expect(example == SettingDocuments.environmentExample(), "siwa.env.example is stale: swift run siwa config-reference --env")
    }

    /// Every variable a program reads is defined once, in the catalog: a `"SIWA_..."` literal in the
    /// sources that the catalog lacks is a setting nobody documented.
    @Test func everyVariableTheCodeNamesIsInTheCatalog() throws {
        let sources = Self.repository.appendingPathComponent("Sources")
        let files = FileManager.default.enumerator(atPath: sources.path)?.compactMap { $0 as? String }.filter { $0.hasSuffix(".swift") } ?? []
        #expect(files.count > 50)
        let pattern = try Regex(#""(SIWA_[A-Z0-9_]+|DATABASE_URL)""#)
        var missing: Set<String> = []
        for file in files {
            let text = try String(contentsOf: sources.appendingPathComponent(file), encoding: .utf8)
            for match in text.matches(of: pattern) {
                var name = String(text[match.range].dropFirst().dropLast())
                if SettingCatalog.named(name) == nil, name.hasSuffix("_FILE"), name != "SIWA_PRIVATE_KEY_FILE" {
                    name = String(name.dropLast(5))
                }
                if SettingCatalog.named(name) == nil { missing.insert("\(name) (\(file))") }
            }
        }
        #expect(missing.isEmpty, "not in SettingCatalog: \(missing.sorted())")
    }

    @Test func eachNameOnceAndEveryRowComplete() {
        let names = SettingCatalog.all.map(\.name)
        #expect(Set(names).count == names.count)
        for setting in SettingCatalog.all { #expect(!setting.meaning.isEmpty && !setting.defaultText.isEmpty, "\(setting.name)") }
        #expect(SettingCatalog.names(readBy: .receiver).contains("SIWA_RECEIVER_THREADS"))
        #expect(!SettingCatalog.names(readBy: .receiver).contains("SIWA_TOKEN_KEYS"), "the receiver holds no Apple secrets")
    }

    @Test func usageShowsDefaultsAndPlainText() {
        let text = SettingDocuments.usage(readBy: .receiver)
        #expect(text.contains("SIWA_LISTEN  [0.0.0.0:8080"))
        #expect(!text.contains("`"))
    }
}
