// The build tool behind the EmbedSQL plugin: writes `sql/NNN_*.sql` and `sql/functions/*.sql` as one
// Swift file of string literals for the Migrations module.
//   embed-sql SQL_FOLDER OUTPUT_FILE
import Foundation

/// A file's text as the migrator stores and compares it: trailing spaces cut from every line, no
/// final newline. Releases before build-time embedding normalised the same way, so a database they
/// made sees the same function text and re-applies nothing.
func normalised(_ text: String) -> String {
    var lines = text.split(separator: "\n", omittingEmptySubsequences: false).map { line in
        var line = Substring(line)
        while let last = line.last, last == " " || last == "\t" || last == "\r" { line.removeLast() }
        return line
    }
    if lines.last?.isEmpty == true { lines.removeLast() }
    return lines.joined(separator: "\n")
}

func literal(_ path: String) throws -> String {
    let text = normalised(try String(contentsOfFile: path, encoding: .utf8))
    guard !text.contains("\"####") else { throw EmbedError("\(path) contains the raw-string delimiter \"####") }
    return "####\"\"\"\n" + text + "\n\"\"\"####"
}

struct EmbedError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

func sqlFiles(in folder: String, matching pattern: String) throws -> [String] {
    try FileManager.default.contentsOfDirectory(atPath: folder)
        .filter { $0.range(of: pattern, options: .regularExpression) != nil }
        .sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
}

func generate(sqlFolder: String) throws -> String {
    var out = "// Generated at build time by the EmbedSQL plugin from sql/. Not committed.\n\n"
    out += "extension Migration {\n    package static let embedded: [Migration] = [\n"
    for file in try sqlFiles(in: sqlFolder, matching: #"^[0-9]{3}_.*\.sql$"#) {
        let name = String(file.dropLast(4))
        out += "        Migration(version: \(Int(file.prefix(3))!), name: \"\(name)\", sql: \(try literal("\(sqlFolder)/\(file)"))),\n"
    }
    out += "    ]\n}\n\nextension FunctionDefinitions {\n    package static let embedded: [FunctionDefinitions] = [\n"
    let functions = "\(sqlFolder)/functions"
    for file in try sqlFiles(in: functions, matching: #"\.sql$"#) {
        out += "        FunctionDefinitions(name: \"\(file.dropLast(4))\", sql: \(try literal("\(functions)/\(file)"))),\n"
    }
    out += "    ]\n}\n"
    return out
}

let arguments = CommandLine.arguments
guard arguments.count == 3 else {
    FileHandle.standardError.write(Data("usage: embed-sql SQL_FOLDER OUTPUT_FILE\n".utf8))
    exit(2)
}
do {
    let swift = try generate(sqlFolder: arguments[1])
    // Rewritten only when it changes, so an unchanged sql/ recompiles nothing.
    if (try? String(contentsOfFile: arguments[2], encoding: .utf8)) != swift {
        try swift.write(toFile: arguments[2], atomically: true, encoding: .utf8)
    }
} catch {
    FileHandle.standardError.write(Data("embed-sql: \(error)\n".utf8))
    exit(1)
}
