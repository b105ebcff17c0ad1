import Foundation

/// The file the sending team hands to the recipient: a header line, then `transfer_sub,app_user_id`
/// per user. No `sub`, no email: nothing team-scoped or personal beyond the app's own user ID.
/// An `app_user_id` holding a comma, quote or line break is quoted as in RFC 4180.
package enum TransferFile {
    package static let header = "transfer_sub,app_user_id"

    package static func line(transferSub: String, appUserID: String) -> String {
        "\(transferSub),\(quoted(appUserID))"
    }

    /// What one input line holds.
    package enum Parsed: Equatable, Sendable {
        /// Header, blank line or `#` comment.
        case skip
        case malformed
        case entry(transferSub: String, appUserID: String)
    }

    package static func parse(_ line: String) -> Parsed {
        let text = line.hasSuffix("\r") ? String(line.dropLast()) : line
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        if trimmed.isEmpty || trimmed.hasPrefix("#") || trimmed == header { return .skip }
        guard let comma = trimmed.firstIndex(of: ",") else { return .malformed }
        let transferSub = String(trimmed[..<comma])
        guard !transferSub.isEmpty, transferSub.unicodeScalars.allSatisfy(isIdentifierScalar),
            let appUserID = unquoted(String(trimmed[trimmed.index(after: comma)...])), !appUserID.isEmpty
        else { return .malformed }
        return .entry(transferSub: transferSub, appUserID: appUserID)
    }

    /// Apple's identifiers are printable ASCII without separators.
    private static func isIdentifierScalar(_ scalar: Unicode.Scalar) -> Bool {
        scalar.isASCII && scalar.value > 0x20 && scalar.value < 0x7F && scalar != "," && scalar != "\""
    }

    private static func quoted(_ field: String) -> String {
        guard field.contains(where: { $0 == "," || $0 == "\"" || $0 == "\n" || $0 == "\r" }) else { return field }
        return "\"" + field.replacingOccurrences(of: "\"", with: "\"\"") + "\""
    }

    /// A plain field (no comma, no quote), or one quoted field with `""` for a quote; nil otherwise.
    private static func unquoted(_ field: String) -> String? {
        guard field.hasPrefix("\"") else {
            return field.contains(",") || field.contains("\"") ? nil : field
        }
        guard field.count >= 2, field.hasSuffix("\"") else { return nil }
        let inner = field.dropFirst().dropLast()
        var result = ""
        var index = inner.startIndex
        while index < inner.endIndex {
            let character = inner[index]
            index = inner.index(after: index)
            if character == "\"" {
                guard index < inner.endIndex, inner[index] == "\"" else { return nil }
                index = inner.index(after: index)
            }
            result.append(character)
        }
        return result
    }
}
