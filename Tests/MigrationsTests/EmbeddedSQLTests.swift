import Foundation
import Migrations
import Testing

@Suite struct EmbeddedMigrationsTests {
    /// The binary carries sql/*.sql exactly as the folder holds them (the EmbedSQL plugin writes them
    /// in at build time): every numbered file, in order, with its version, and nothing else.
    @Test func embeddedMigrationsMatchSQLFolder() throws {
        let folder = URL(fileURLWithPath: #filePath)
            .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("sql")
        let files = try FileManager.default.contentsOfDirectory(atPath: folder.path)
            .filter { $0.range(of: #"^\d{3}_.*\.sql$"#, options: .regularExpression) != nil }.sorted()
        #expect(files.map { String($0.dropLast(4)) } == Migration.embedded.map(\.name))
        for (file, migration) in zip(files, Migration.embedded) {
            let text = try String(contentsOf: folder.appendingPathComponent(file), encoding: .utf8)
            #expect(migration.sql.trimmingCharacters(in: .newlines) == Self.normalised(text), "\(file) differs from what the binary embeds")
            #expect(migration.version == Int(file.prefix(3)))
        }
    }

    /// The same for `sql/functions/*.sql`.
    @Test func embeddedFunctionFilesMatchSQLFolder() throws {
        let folder = URL(fileURLWithPath: #filePath)
            .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("sql/functions")
        let files = try FileManager.default.contentsOfDirectory(atPath: folder.path).filter { $0.hasSuffix(".sql") }.sorted()
        #expect(files.map { String($0.dropLast(4)) } == FunctionDefinitions.embedded.map(\.name))
        for (file, definitions) in zip(files, FunctionDefinitions.embedded) {
            let text = try String(contentsOf: folder.appendingPathComponent(file), encoding: .utf8)
            #expect(definitions.sql.trimmingCharacters(in: .newlines) == Self.normalised(text), "\(file) differs from what the binary embeds")
        }
    }

    private static func normalised(_ text: String) -> String {
        text.split(separator: "\n", omittingEmptySubsequences: false)
            .map { $0.replacingOccurrences(of: #"\s+$"#, with: "", options: .regularExpression) }
            .joined(separator: "\n").trimmingCharacters(in: .newlines)
    }
}
