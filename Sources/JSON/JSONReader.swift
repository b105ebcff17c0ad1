/// Recursive descent over the bytes of one document. The buffer outlives the reader: `parse`
/// holds it for the whole call.
struct JSONReader {
    private let bytes: UnsafeBufferPointer<UInt8>
    private var position = 0

    init(bytes: UnsafeBufferPointer<UInt8>) {
        self.bytes = bytes
    }

    var atEnd: Bool { position == bytes.count }

    func error(_ reason: String) -> JSONParseError { JSONParseError(reason: reason, offset: position) }

    mutating func skipWhitespace() {
        while position < bytes.count {
            switch bytes[position] {
            case UInt8(ascii: " "), UInt8(ascii: "\t"), UInt8(ascii: "\n"), UInt8(ascii: "\r"): position += 1
            default: return
            }
        }
    }

    mutating func readValue(depth: Int) throws(JSONParseError) -> JSONValue {
        guard position < bytes.count else { throw error("unexpected end of input") }
        switch bytes[position] {
        case UInt8(ascii: "{"): return try readObject(depth: depth + 1)
        case UInt8(ascii: "["): return try readArray(depth: depth + 1)
        case UInt8(ascii: "\""): return .string(try readString())
        case UInt8(ascii: "t"): try readLiteral("true"); return .bool(true)
        case UInt8(ascii: "f"): try readLiteral("false"); return .bool(false)
        case UInt8(ascii: "n"): try readLiteral("null"); return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return .number(try readNumber())
        default: throw error("unexpected byte \(bytes[position])")
        }
    }

    private mutating func readObject(depth: Int) throws(JSONParseError) -> JSONValue {
        guard depth <= JSONValue.maximumDepth else { throw error("nested deeper than \(JSONValue.maximumDepth)") }
        position += 1  // {
        var members: [String: JSONValue] = [:]
        skipWhitespace()
        if try consume(UInt8(ascii: "}")) { return .object(members) }
        // The document's own object (a token's claims, 13 for Apple's identity token) gets room in
        // one allocation: grown from empty, the table was reallocated and its names hashed again
        // four times per token. Nested objects grow as needed: reserving for each, a body of many
        // tiny objects (`[{"a":0},...]`) would cost a kilobyte of table per eight bytes sent.
        if depth == 1 { members.reserveCapacity(16) }
        while true {
            skipWhitespace()
            guard position < bytes.count, bytes[position] == UInt8(ascii: "\"") else { throw error("expected a member name") }
            let start = position
            let name = try readString()
            skipWhitespace()
            guard try consume(UInt8(ascii: ":")) else { throw error("expected ':' after a member name") }
            skipWhitespace()
            let value = try readValue(depth: depth)
            guard members.updateValue(value, forKey: name) == nil else {
                throw JSONParseError(reason: "duplicate member name \"\(name)\"", offset: start)
            }
            skipWhitespace()
            if try consume(UInt8(ascii: ",")) { continue }
            if try consume(UInt8(ascii: "}")) { return .object(members) }
            throw error("expected ',' or '}' in an object")
        }
    }

    private mutating func readArray(depth: Int) throws(JSONParseError) -> JSONValue {
        guard depth <= JSONValue.maximumDepth else { throw error("nested deeper than \(JSONValue.maximumDepth)") }
        position += 1  // [
        var elements: [JSONValue] = []
        skipWhitespace()
        if try consume(UInt8(ascii: "]")) { return .array(elements) }
        while true {
            skipWhitespace()
            elements.append(try readValue(depth: depth))
            skipWhitespace()
            if try consume(UInt8(ascii: ",")) { continue }
            if try consume(UInt8(ascii: "]")) { return .array(elements) }
            throw error("expected ',' or ']' in an array")
        }
    }

    private mutating func consume(_ byte: UInt8) throws(JSONParseError) -> Bool {
        guard position < bytes.count else { throw error("unexpected end of input") }
        guard bytes[position] == byte else { return false }
        position += 1
        return true
    }

    private mutating func readLiteral(_ word: StaticString) throws(JSONParseError) {
        let count = word.utf8CodeUnitCount
        guard bytes.count - position >= count else { throw error("unexpected end of input") }
        for offset in 0..<count where bytes[position + offset] != word.utf8Start[offset] {
            throw error("expected \(word)")
        }
        position += count
    }

    // MARK: Strings

    /// Reads `"..."`. Runs without escapes are copied as they are, after UTF-8 validation. With
    /// escapes (Apple's `events` claim is a JSON string holding JSON: a dozen `\"` in one string)
    /// the runs and the escaped characters gather as bytes, made a String once at the end, not
    /// appended to one a run and an escape at a time.
    private mutating func readString() throws(JSONParseError) -> String {
        position += 1  // opening quote
        var runStart = position
        var unescaped: [UInt8]?  // only made once an escape forces it
        while position < bytes.count {
            let byte = bytes[position]
            switch byte {
            case UInt8(ascii: "\""):
                guard unescaped != nil else {
                    let run = try validated(runStart..<position)
                    position += 1
                    return run
                }
                try checkUTF8(runStart..<position)
                unescaped!.append(contentsOf: bytes[runStart..<position])
                position += 1
                // Valid runs and whole encoded scalars: valid UTF-8 as a whole.
                return String(decoding: unescaped!, as: UTF8.self)
            case UInt8(ascii: "\\"):
                try checkUTF8(runStart..<position)
                if unescaped == nil { unescaped = [] }
                unescaped!.append(contentsOf: bytes[runStart..<position])
                position += 1
                let scalar = try readEscape()
                if scalar.isASCII {
                    unescaped!.append(UInt8(truncatingIfNeeded: scalar.value))
                } else {
                    unescaped!.append(contentsOf: UTF8.encode(scalar)!)  // every scalar has a UTF-8 form
                }
                runStart = position
            case 0..<0x20:
                throw error("control character in a string")
            default:
                position += 1
            }
        }
        throw error("unterminated string")
    }

    private func validated(_ range: Range<Int>) throws(JSONParseError) -> String {
        guard !range.isEmpty else { return "" }
        let run = UnsafeBufferPointer(rebasing: bytes[range])
        // Nearly every string of a token or a form is ASCII, valid UTF-8 as it is: decoded without
        // `String(validating:as:)`, which is generic and looks its metadata up at run time per call.
        if run.allSatisfy({ $0 < 0x80 }) { return String(decoding: run, as: UTF8.self) }
        guard let text = String(validating: run, as: UTF8.self) else {
            throw JSONParseError(reason: "invalid UTF-8 in a string", offset: range.lowerBound)
        }
        return text
    }

    /// `validated(_:)`'s check alone, for a run gathered as bytes.
    private func checkUTF8(_ range: Range<Int>) throws(JSONParseError) {
        let run = UnsafeBufferPointer(rebasing: bytes[range])
        if run.allSatisfy({ $0 < 0x80 }) { return }
        guard String(validating: run, as: UTF8.self) != nil else {
            throw JSONParseError(reason: "invalid UTF-8 in a string", offset: range.lowerBound)
        }
    }

    /// After a backslash: one escape, `\uXXXX` surrogate pairs joined.
    private mutating func readEscape() throws(JSONParseError) -> Unicode.Scalar {
        guard position < bytes.count else { throw error("unterminated string") }
        let byte = bytes[position]
        position += 1
        switch byte {
        case UInt8(ascii: "\""): return "\""
        case UInt8(ascii: "\\"): return "\\"
        case UInt8(ascii: "/"): return "/"
        case UInt8(ascii: "b"): return "\u{08}"
        case UInt8(ascii: "f"): return "\u{0C}"
        case UInt8(ascii: "n"): return "\n"
        case UInt8(ascii: "r"): return "\r"
        case UInt8(ascii: "t"): return "\t"
        case UInt8(ascii: "u"):
            let first = try readHex4()
            switch first {
            case 0xD800..<0xDC00:
                guard bytes.count - position >= 2, bytes[position] == UInt8(ascii: "\\"),
                      bytes[position + 1] == UInt8(ascii: "u")
                else { throw error("high surrogate without its low surrogate") }
                position += 2
                let second = try readHex4()
                guard (0xDC00..<0xE000).contains(second) else { throw error("high surrogate without its low surrogate") }
                let combined = 0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00)
                return Unicode.Scalar(combined)!  // in 0x10000...0x10FFFF by construction
            case 0xDC00..<0xE000:
                throw error("low surrogate without its high surrogate")
            default:
                return Unicode.Scalar(first)!  // not a surrogate, so a valid scalar
            }
        default:
            throw error("unknown escape \\\(Character(Unicode.Scalar(byte)))")
        }
    }

    private mutating func readHex4() throws(JSONParseError) -> UInt32 {
        guard bytes.count - position >= 4 else { throw error("truncated \\u escape") }
        var value: UInt32 = 0
        for _ in 0..<4 {
            let byte = bytes[position]
            let digit: UInt8
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = byte - UInt8(ascii: "A") + 10
            default: throw error("bad hex digit in a \\u escape")
            }
            value = value << 4 | UInt32(digit)
            position += 1
        }
        return value
    }

    // MARK: Numbers

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`, checked here; the value from the
    /// standard library's correctly rounded conversion.
    private mutating func readNumber() throws(JSONParseError) -> Double {
        let start = position
        if bytes[position] == UInt8(ascii: "-") { position += 1 }
        guard position < bytes.count else { throw error("truncated number") }
        if bytes[position] == UInt8(ascii: "0") {
            position += 1
        } else {
            guard digits() > 0 else { throw error("expected a digit") }
        }
        if position < bytes.count, bytes[position] == UInt8(ascii: ".") {
            position += 1
            guard digits() > 0 else { throw error("expected a digit after '.'") }
        }
        if position < bytes.count, bytes[position] == UInt8(ascii: "e") || bytes[position] == UInt8(ascii: "E") {
            position += 1
            if position < bytes.count, bytes[position] == UInt8(ascii: "+") || bytes[position] == UInt8(ascii: "-") {
                position += 1
            }
            guard digits() > 0 else { throw error("expected a digit in an exponent") }
        }
        let text = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<position]), as: UTF8.self)
        guard let value = Double(text), value.isFinite else {
            throw JSONParseError(reason: "number out of range", offset: start)
        }
        return value
    }

    private mutating func digits() -> Int {
        let start = position
        while position < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[position]) { position += 1 }
        return position - start
    }
}
