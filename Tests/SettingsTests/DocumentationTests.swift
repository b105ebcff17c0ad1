import Foundation
import Testing

/// The repository's Markdown: the README stays a landing page (under 25 KB), and every relative
/// link in every Markdown file leads somewhere: a file or folder that exists and, with `#anchor`,
/// a heading of that file.
@Suite struct DocumentationTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    @Test func theReadmeStaysUnder25KB() throws {
        let size = try Data(contentsOf: Self.root.appendingPathComponent("README.md")).count
        #expect(size < 25_000, "README.md is \(size) bytes: move detail to the README of the folder it describes")
    }

    /// Every folder of `Sources` (a module, a C wrapper, an executable, the plugin) has a README.md
    /// saying what lives there, what it may import and where to start reading: a new module without
    /// one fails here.
    @Test func everySourcesFolderHasAReadmeThatSaysWhatItImports() throws {
        let sources = Self.root.appendingPathComponent("Sources")
        let folders = try FileManager.default.contentsOfDirectory(atPath: sources.path).filter { name in
            var isFolder: ObjCBool = false
            return FileManager.default.fileExists(atPath: sources.appendingPathComponent(name).path, isDirectory: &isFolder)
                && isFolder.boolValue
        }.sorted()
        #expect(folders.count > 30 && folders.contains("Postgres") && folders.contains("siwa"), "\(folders)")
        var missing: [String] = []
        var silentOnImports: [String] = []
        for folder in folders {
            let readme = sources.appendingPathComponent(folder).appendingPathComponent("README.md")
            guard let text = try? String(contentsOf: readme, encoding: .utf8) else {
                missing.append("Sources/\(folder)")
                continue
            }
            if text.range(of: "import", options: .caseInsensitive) == nil { silentOnImports.append("Sources/\(folder)/README.md") }
        }
        #expect(missing.isEmpty, "no README.md (what lives here, what it may import, where to start reading): \(missing)")
        #expect(silentOnImports.isEmpty, "says nothing of what it imports or who imports it: \(silentOnImports)")
    }

    @Test func everyRelativeLinkInTheMarkdownFilesResolves() throws {
        let files = try Self.markdownFiles()
        #expect(files.contains("README.md") && files.contains("deploy/README.md"), "\(files)")
        var checked = 0
        var broken: [String] = []
        for file in files {
            let text = try String(contentsOf: Self.root.appendingPathComponent(file), encoding: .utf8)
            for link in MarkdownLinks.relativeLinks(in: text) {
                checked += 1
                if let problem = MarkdownLinks.problem(with: link, in: file, root: Self.root) { broken.append("\(file): \(link): \(problem)") }
            }
        }
        #expect(checked >= 20, "found only \(checked) relative links: is the link pattern still right?")
        #expect(broken.isEmpty, "\(broken.joined(separator: "\n"))")
    }

    /// The checker itself, on a document made up for it: it must see what is broken.
    @Test func theLinkCheckerFindsBrokenLinksAndAnchors() throws {
        let text = """
            # Title
            ## Reading `siwa status`
            [ok](#reading-siwa-status) [gone](#nowhere) [file](Package.swift) [missing](nope.md)
            [folder](Sources/) [heading](deploy/README.md#checks) [bad heading](deploy/README.md#no-such)
            [web](https://example.com) `[code](not-a-link.md)`
            ```
            [fenced](not-a-link-either.md)
            ```
            """
        let links = MarkdownLinks.relativeLinks(in: text)
        #expect(links == ["#reading-siwa-status", "#nowhere", "Package.swift", "nope.md", "Sources/", "deploy/README.md#checks", "deploy/README.md#no-such"])
        let file = "doc.md"
        let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("doc-links-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: scratch, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: scratch) }
        try text.write(to: scratch.appendingPathComponent(file), atomically: true, encoding: .utf8)
        try "x".write(to: scratch.appendingPathComponent("Package.swift"), atomically: true, encoding: .utf8)
        try FileManager.default.createDirectory(at: scratch.appendingPathComponent("Sources"), withIntermediateDirectories: true)
        try FileManager.default.createDirectory(at: scratch.appendingPathComponent("deploy"), withIntermediateDirectories: true)
        try "# Deploy\n## Checks\n".write(to: scratch.appendingPathComponent("deploy/README.md"), atomically: true, encoding: .utf8)
        let broken = links.filter { MarkdownLinks.problem(with: $0, in: file, root: scratch) != nil }
        #expect(broken == ["#nowhere", "nope.md", "deploy/README.md#no-such"])
    }

    /// Every `.md` of the repository outside build products, relative to the root.
    static func markdownFiles() throws -> [String] {
        guard let walker = FileManager.default.enumerator(at: root, includingPropertiesForKeys: nil) else { return [] }
        var files: [String] = []
        for case let url as URL in walker {
            let path = String(url.standardizedFileURL.path.dropFirst(root.standardizedFileURL.path.count + 1))
            if path.hasPrefix(".build") || path.hasPrefix(".git") || path.hasPrefix(".swiftpm") {
                walker.skipDescendants()
            } else if path.hasSuffix(".md") {
                files.append(path)
            }
        }
        return files.sorted()
    }
}

/// Links in Markdown as GitHub renders them, enough for our own files: `[text](target)` outside
/// code spans and fenced blocks, and headings' anchors by GitHub's rule.
enum MarkdownLinks {
    /// Targets that are not absolute URLs, in order.
    static func relativeLinks(in text: String) -> [String] {
        let pattern = try! NSRegularExpression(pattern: #"\]\(([^()\s]+)(?:\s+"[^"]*")?\)"#)
        var links: [String] = []
        for line in prose(text) {
            let withoutCode = line.replacingOccurrences(of: #"`[^`]*`"#, with: "", options: .regularExpression)
            let range = NSRange(withoutCode.startIndex..., in: withoutCode)
            for match in pattern.matches(in: withoutCode, range: range) {
                guard let target = Range(match.range(at: 1), in: withoutCode).map({ String(withoutCode[$0]) }) else { continue }
                if target.contains("://") || target.hasPrefix("mailto:") { continue }
                links.append(target)
            }
        }
        return links
    }

    /// What is wrong with `link` written in `file` (a path relative to `root`), or nil.
    static func problem(with link: String, in file: String, root: URL) -> String? {
        let parts = link.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false).map(String.init)
        let directory = root.appendingPathComponent(file).deletingLastPathComponent()
        let target = parts[0].isEmpty ? root.appendingPathComponent(file) : directory.appendingPathComponent(parts[0])
        guard FileManager.default.fileExists(atPath: target.standardizedFileURL.path) else { return "no such file" }
        guard parts.count == 2 else { return nil }
        guard let text = try? String(contentsOf: target, encoding: .utf8) else { return "anchor into a file that is not text" }
        return anchors(in: text).contains(parts[1]) ? nil : "no heading with this anchor"
    }

    /// GitHub's heading anchors: lowercased, punctuation dropped, spaces to hyphens, repeats numbered.
    static func anchors(in text: String) -> Set<String> {
        var seen: [String: Int] = [:]
        var result: Set<String> = []
        for line in prose(text) where line.hasPrefix("#") {
            let title = line.drop { $0 == "#" }.trimmingCharacters(in: .whitespaces)
            let slug = String(
                title.lowercased().unicodeScalars.filter { $0.properties.isAlphabetic || ("0"..."9").contains($0) || $0 == " " || $0 == "-" || $0 == "_" }
                    .map { $0 == " " ? "-" : Character($0) })
            let count = seen[slug, default: 0]
            seen[slug] = count + 1
            result.insert(count == 0 ? slug : "\(slug)-\(count)")
        }
        return result
    }

    /// The lines outside fenced code blocks.
    private static func prose(_ text: String) -> [String] {
        var fenced = false
        var lines: [String] = []
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            if line.trimmingCharacters(in: .whitespaces).hasPrefix("```") {
                fenced.toggle()
                continue
            }
            if !fenced { lines.append(String(line)) }
        }
        return lines
    }
}
