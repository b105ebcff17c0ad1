import Foundation
import PackagePlugin

/// Embeds `sql/` in the Migrations module at build time, so `siwa migrate` carries the exact SQL it
/// was built from and no generated Swift is committed (a SQL change then shows once in a diff).
/// `Sources/Migrations/SQL` is a link to `sql/`, declared as the target's resources: SwiftPM then
/// hands this plugin every file in it, and runs it again when one is added or removed (a folder
/// outside the target would keep the file list of the first run).
@main struct EmbedSQLPlugin: BuildToolPlugin {
    func createBuildCommands(context: PluginContext, target: any Target) throws -> [Command] {
        guard let module = target as? SourceModuleTarget else { return [] }
        let inputs = module.sourceFiles.filter { $0.type == .resource && $0.url.pathExtension == "sql" }.map(\.url)
        let output = context.pluginWorkDirectoryURL.appending(path: "EmbeddedMigrations.swift")
        return [
            .buildCommand(
                displayName: "Embedding sql/ in \(target.name)",
                executable: try context.tool(named: "embed-sql").url,
                arguments: [context.package.directoryURL.appending(path: "sql").path(percentEncoded: false),
                            output.path(percentEncoded: false)],
                inputFiles: inputs,
                outputFiles: [output])
        ]
    }
}
