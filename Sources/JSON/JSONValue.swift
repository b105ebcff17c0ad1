/// A JSON document (RFC 8259), read strictly.
///
/// Made for the small documents that arrive from the network on every request: JWS headers and
/// claims. Foundation's `JSONSerialization` bridges each value to an Objective-C style object and
/// cost the receiver an eighth of its CPU; this reads straight into Swift values.
///
/// Strict where leniency would be a security question: a duplicate member name is an error (RFC
/// 7515 §5.2 lets a JWS reader refuse them, and two readers picking different duplicates is how
/// signature checks get bypassed), as are invalid UTF-8, lone surrogates, control characters in
/// strings, non-finite numbers, trailing bytes and nesting deeper than `maximumDepth`.
package enum JSONValue: Sendable, Equatable {
    case null
    case bool(Bool)
    /// Every JSON number, as the nearest Double (exact for integers up to 2^53).
    case number(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    /// Deepest nesting accepted. Apple's claims nest two levels; a bound keeps hostile input from
    /// exhausting the stack.
    package static let maximumDepth = 32

    /// Parses a whole document: one value, surrounded by optional whitespace.
    package static func parse(_ bytes: some Collection<UInt8>) throws(JSONParseError) -> JSONValue {
        let contiguous = bytes.withContiguousStorageIfAvailable { buffer in
            Result { () throws(JSONParseError) in try parse(buffer: buffer) }
        }
        if let contiguous { return try contiguous.get() }
        return try Array(bytes).withUnsafeBufferPointer { buffer throws(JSONParseError) in try parse(buffer: buffer) }
    }

    /// `parse`, for callers that need an object and have no use for the reason it is not one.
    package static func object(_ bytes: some Collection<UInt8>) -> [String: JSONValue]? {
        guard case .object(let members)? = try? parse(bytes) else { return nil }
        return members
    }

    private static func parse(buffer: UnsafeBufferPointer<UInt8>) throws(JSONParseError) -> JSONValue {
        var reader = JSONReader(bytes: buffer)
        reader.skipWhitespace()
        let value = try reader.readValue(depth: 0)
        reader.skipWhitespace()
        guard reader.atEnd else { throw reader.error("unexpected bytes after the document") }
        return value
    }

    package subscript(member: String) -> JSONValue? {
        guard case .object(let members) = self else { return nil }
        return members[member]
    }

    package var stringValue: String? {
        guard case .string(let text) = self else { return nil }
        return text
    }

    package var numberValue: Double? {
        guard case .number(let number) = self else { return nil }
        return number
    }
}

/// Why bytes are not a JSON document, and where reading stopped.
package struct JSONParseError: Error, Equatable, CustomStringConvertible {
    package var reason: String
    package var offset: Int

    package var description: String { "invalid JSON at byte \(offset): \(reason)" }
}
