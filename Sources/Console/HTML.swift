import Foundation

/// Markup whose interpolations escape by default: `"<td>\(sub)</td>"` as `HTML` escapes `sub`, so
/// a value from the database (a `sub`, an `app_user_id`, an error text) can never become markup.
/// Only another `HTML` value (built the same way) is inserted as it is.
struct HTML: ExpressibleByStringInterpolation, Sendable {
    private(set) var text: String

    init(stringLiteral literal: String) { text = literal }
    init(stringInterpolation: Interpolation) { text = stringInterpolation.text }

    static func + (lhs: HTML, rhs: HTML) -> HTML {
        var joined = lhs
        joined.text += rhs.text
        return joined
    }

    static func += (lhs: inout HTML, rhs: HTML) { lhs.text += rhs.text }

    struct Interpolation: StringInterpolationProtocol {
        fileprivate var text = ""

        init(literalCapacity: Int, interpolationCount: Int) { text.reserveCapacity(literalCapacity * 2) }

        mutating func appendLiteral(_ literal: String) { text += literal }
        mutating func appendInterpolation(_ value: String) { text += HTML.escape(value) }
        mutating func appendInterpolation(_ value: String?) { text += HTML.escape(value ?? "") }
        mutating func appendInterpolation(_ value: HTML) { text += value.text }
        mutating func appendInterpolation(_ values: [HTML]) { for value in values { text += value.text } }
        mutating func appendInterpolation<Number: BinaryInteger>(_ value: Number) { text += String(value) }
        /// A number for an SVG attribute: one decimal, no exponent.
        mutating func appendInterpolation(_ value: Double) { text += String(format: "%.1f", value) }
    }

    /// Escapes the five characters that can end a text node or an attribute value.
    static func escape(_ text: String) -> String {
        var escaped = ""
        escaped.reserveCapacity(text.utf8.count)
        for character in text.unicodeScalars {
            switch character {
            case "&": escaped += "&amp;"
            case "<": escaped += "&lt;"
            case ">": escaped += "&gt;"
            case "\"": escaped += "&quot;"
            case "'": escaped += "&#39;"
            // Controls other than tab and line breaks have no business in a page (a NUL in a sub).
            case "\u{0}"..."\u{8}", "\u{B}", "\u{C}", "\u{E}"..."\u{1F}", "\u{7F}": escaped += "\u{FFFD}"
            default: escaped.unicodeScalars.append(character)
            }
        }
        return escaped
    }

    /// `values` joined with `separator`.
    static func join(_ values: [HTML], separator: HTML = "") -> HTML {
        var joined: HTML = ""
        for (index, value) in values.enumerated() {
            if index > 0 { joined += separator }
            joined += value
        }
        return joined
    }
}

/// Percent-encoding for the parts of the console's own links.
enum URLPart {
    private static let unreserved = CharacterSet(charactersIn: "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")

    /// One path segment or query value (everything but RFC 3986's unreserved characters encoded).
    static func encode(_ text: String) -> String {
        text.addingPercentEncoding(withAllowedCharacters: unreserved) ?? ""
    }

    /// `/accounts/{client_id}/{sub}`.
    static func account(clientID: String, sub: String) -> String {
        "/accounts/\(encode(clientID))/\(encode(sub))"
    }

    /// A path with a query of the non-empty items.
    static func path(_ path: String, query: [(String, String?)]) -> String {
        let items = query.compactMap { name, value in value.flatMap { $0.isEmpty ? nil : "\(name)=\(encode($0))" } }
        return items.isEmpty ? path : path + "?" + items.joined(separator: "&")
    }

    /// `application/x-www-form-urlencoded` fields (a form's POST body); the last of a repeated name wins.
    static func formFields(_ body: String) -> [String: String] {
        var fields: [String: String] = [:]
        for pair in body.split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            func decode(_ part: Substring) -> String {
                part.replacingOccurrences(of: "+", with: " ").removingPercentEncoding ?? ""
            }
            fields[decode(parts[0])] = parts.count > 1 ? decode(parts[1]) : ""
        }
        return fields
    }
}
