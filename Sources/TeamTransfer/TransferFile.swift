/// The file the sending team hands to the recipient: a header line, then `transfer_sub,app_user_id`
/// per user. No `sub`, no email: nothing team-scoped or personal beyond the app's own user ID.
///
/// Every record is one physical line, so a tool that reads line by line (ours, `wc -l`, `split`)
/// never cuts a user in two. An `app_user_id` that a plain CSV field cannot carry on one line (a
/// comma, a quote, a line break or another control character, white space at either end) is
/// quoted as in RFC 4180 (`""` for a quote), and inside quotes a backslash escapes: `\\`, `\n`,
/// `\r`, `\t`, and `\uXXXX` for the other control characters. The reader undoes exactly that, so
/// every `app_user_id` PostgreSQL can hold reads back as it was written; anything else is malformed.
/// The text is handled scalar by scalar: a combining mark after a comma or a quote must not hide it.
package enum TransferFile {
    package static let header = "transfer_sub,app_user_id"

    /// The record, or nil when `transferSub` is not an identifier Apple could have issued (it
    /// would corrupt the file: the caller reports the account instead of writing it).
    package static func line(transferSub: String, appUserID: String) -> String? {
        guard isIdentifier(transferSub) else { return nil }
        return "\(transferSub),\(field(appUserID))"
    }

    /// What one input line holds.
    package enum Parsed: Equatable, Sendable {
        /// Header, blank line or `#` comment.
        case skip
        case malformed
        case entry(transferSub: String, appUserID: String)
    }

    package static func parse(_ line: String) -> Parsed {
        var scalars = Substring(line).unicodeScalars[...]
        if scalars.last == "\r" { scalars = scalars.dropLast() }
        while let first = scalars.first, first.properties.isWhitespace { scalars = scalars.dropFirst() }
        while let last = scalars.last, last.properties.isWhitespace { scalars = scalars.dropLast() }
        let text = String(String.UnicodeScalarView(scalars))
        if text.isEmpty || text.hasPrefix("#") || text == header { return .skip }
        guard let comma = scalars.firstIndex(of: ",") else { return .malformed }
        let transferSub = String(String.UnicodeScalarView(scalars[..<comma]))
        // NUL: PostgreSQL's text cannot hold it, so no export wrote it.
        guard isIdentifier(transferSub), let appUserID = unquoted(scalars[scalars.index(after: comma)...]), !appUserID.isEmpty,
            !appUserID.unicodeScalars.contains("\u{0}")
        else { return .malformed }
        return .entry(transferSub: transferSub, appUserID: appUserID)
    }

    /// Apple's identifiers are printable ASCII without separators.
    package static func isIdentifier(_ text: String) -> Bool {
        !text.isEmpty
            && text.unicodeScalars.allSatisfy { $0.isASCII && $0.value > 0x20 && $0.value < 0x7F && $0 != "," && $0 != "\"" }
    }

    // MARK: Writing

    private static func field(_ value: String) -> String {
        let scalars = value.unicodeScalars
        let needsQuotes =
            scalars.contains { $0 == "," || $0 == "\"" || isControl($0) }
            || scalars.first.map { $0.properties.isWhitespace } == true
            || scalars.last.map { $0.properties.isWhitespace } == true
        guard needsQuotes else { return value }
        var out = String.UnicodeScalarView()
        out.append("\"")
        for scalar in scalars {
            switch scalar {
            case "\"": out.append(contentsOf: "\"\"".unicodeScalars)
            case "\\": out.append(contentsOf: "\\\\".unicodeScalars)
            case "\n": out.append(contentsOf: "\\n".unicodeScalars)
            case "\r": out.append(contentsOf: "\\r".unicodeScalars)
            case "\t": out.append(contentsOf: "\\t".unicodeScalars)
            case _ where isControl(scalar):
                let hex = String(scalar.value, radix: 16, uppercase: true)
                out.append(contentsOf: ("\\u" + String(repeating: "0", count: 4 - hex.count) + hex).unicodeScalars)
            default: out.append(scalar)
            }
        }
        out.append("\"")
        return String(out)
    }

    /// C0 and C1 controls, DEL, and the Unicode line and paragraph separators: what some reader
    /// could take for the end of a line. All are at most U+FFFF, so `\uXXXX` spells each.
    private static func isControl(_ scalar: Unicode.Scalar) -> Bool {
        scalar.value < 0x20 || (0x7F...0x9F).contains(scalar.value) || scalar == "\u{2028}" || scalar == "\u{2029}"
    }

    // MARK: Reading

    /// A plain field (no comma, no quote), or one quoted field as `field(_:)` writes it; nil otherwise.
    private static func unquoted(_ field: Substring.UnicodeScalarView.SubSequence) -> String? {
        guard field.first == "\"" else {
            return field.contains(",") || field.contains("\"") ? nil : String(String.UnicodeScalarView(field))
        }
        var result = String.UnicodeScalarView()
        var rest = field.dropFirst()
        while let scalar = rest.popFirst() {
            switch scalar {
            case "\"":
                guard let next = rest.popFirst() else { return String(result) }  // the closing quote ends the line
                guard next == "\"" else { return nil }
                result.append("\"")
            case "\\":
                guard let escaped = escape(&rest) else { return nil }
                result.append(escaped)
            default:
                result.append(scalar)
            }
        }
        return nil  // no closing quote
    }

    /// The scalar a backslash sequence stands for, consuming it from `rest`; nil when unknown.
    private static func escape(_ rest: inout Substring.UnicodeScalarView.SubSequence) -> Unicode.Scalar? {
        switch rest.popFirst() {
        case "\\": return "\\"
        case "n": return "\n"
        case "r": return "\r"
        case "t": return "\t"
        case "u":
            let digits = rest.prefix(4)
            guard digits.count == 4, digits.allSatisfy({ $0.properties.isASCIIHexDigit }),
                let value = UInt32(String(String.UnicodeScalarView(digits)), radix: 16), let scalar = Unicode.Scalar(value)
            else { return nil }
            rest = rest.dropFirst(4)
            return scalar
        default: return nil
        }
    }
}
