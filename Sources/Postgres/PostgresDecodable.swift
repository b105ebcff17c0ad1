package import Foundation

/// A Swift type that can be read from a column in PostgreSQL's text output format.
///
/// The parsers work on the raw bytes libpq hands out and are `package` so unit tests can feed them
/// text without a server (`Date.decode(postgresText: "2026-11-30 04:24:44.123456+00")`).
package protocol PostgresDecodable: Sendable {
    /// Parses PostgreSQL text output; nil when the text is not a value of this type.
    static func decode(postgresText text: UnsafeBufferPointer<UInt8>) -> Self?
    /// Whether a decoding error may quote the text it saw (false for bytea, which can be anything).
    static var quotesTextInErrors: Bool { get }
}

extension PostgresDecodable {
    package static var quotesTextInErrors: Bool { true }

    package static func decode(postgresText text: String) -> Self? {
        var text = text
        return text.withUTF8 { decode(postgresText: $0) }
    }
}

extension String: PostgresDecodable {
    package static func decode(postgresText text: UnsafeBufferPointer<UInt8>) -> String? {
        String(decoding: text, as: UTF8.self)
    }
}

extension Int64: PostgresDecodable {
    package static func decode(postgresText text: UnsafeBufferPointer<UInt8>) -> Int64? {
        var index = 0
        var negative = false
        if let first = text.first, first == UInt8(ascii: "-") || first == UInt8(ascii: "+") {
            negative = first == UInt8(ascii: "-")
            index = 1
        }
        guard index < text.count else { return nil }
        var magnitude: UInt64 = 0
        while index < text.count {
            let digit = text[index] &- UInt8(ascii: "0")
            guard digit < 10 else { return nil }
            let (times10, overflow1) = magnitude.multipliedReportingOverflow(by: 10)
            let (sum, overflow2) = times10.addingReportingOverflow(UInt64(digit))
            guard !overflow1, !overflow2 else { return nil }
            magnitude = sum
            index += 1
        }
        if negative {
            guard magnitude <= UInt64(Int64.max) + 1 else { return nil }
            return magnitude == UInt64(Int64.max) + 1 ? Int64.min : -Int64(magnitude)
        }
        return magnitude <= UInt64(Int64.max) ? Int64(magnitude) : nil
    }
}

extension Int: PostgresDecodable {
    package static func decode(postgresText text: UnsafeBufferPointer<UInt8>) -> Int? {
        Int64.decode(postgresText: text).flatMap { Int(exactly: $0) }
    }
}

extension Int32: PostgresDecodable {
    package static func decode(postgresText text: UnsafeBufferPointer<UInt8>) -> Int32? {
        Int64.decode(postgresText: text).flatMap { Int32(exactly: $0) }
    }
}

extension Bool: PostgresDecodable {
    /// `t` / `f`, the only spellings PostgreSQL's boolout produces.
    package static func decode(postgresText text: UnsafeBufferPointer<UInt8>) -> Bool? {
        guard text.count == 1 else { return nil }
        switch text[0] {
        case UInt8(ascii: "t"): return true
        case UInt8(ascii: "f"): return false
        default: return nil
        }
    }
}

extension Double: PostgresDecodable {
    /// Decimal, `Infinity`, `-Infinity`, `NaN`.
    package static func decode(postgresText text: UnsafeBufferPointer<UInt8>) -> Double? {
        Double(String(decoding: text, as: UTF8.self))
    }
}

extension Date: PostgresDecodable {
    /// timestamptz / timestamp / date in ISO DateStyle: `2026-11-30 04:24:44.123456+00`, offsets like
    /// `+05:30` or `-03:00:10`, optional fraction, ` BC`, `infinity` (distantFuture) and `-infinity`.
    /// A value without an offset (timestamp, date) is taken as UTC.
    package static func decode(postgresText text: UnsafeBufferPointer<UInt8>) -> Date? {
        var scanner = ByteScanner(text)
        if scanner.consume("infinity") && scanner.atEnd { return .distantFuture }
        scanner = ByteScanner(text)
        if scanner.consume("-infinity") && scanner.atEnd { return .distantPast }
        scanner = ByteScanner(text)

        guard var year = scanner.number(minDigits: 4, maxDigits: 7), scanner.consume("-"),
            let month = scanner.number(minDigits: 2, maxDigits: 2), scanner.consume("-"),
            let day = scanner.number(minDigits: 2, maxDigits: 2), (1...12).contains(month), (1...31).contains(day)
        else { return nil }
        var hour: Int64 = 0, minute: Int64 = 0, second: Int64 = 0, micros: Int64 = 0, offset: Int64 = 0
        if scanner.consume(" ") || scanner.consume("T") {
            guard let h = scanner.number(minDigits: 2, maxDigits: 2), scanner.consume(":"),
                let m = scanner.number(minDigits: 2, maxDigits: 2), scanner.consume(":"),
                let s = scanner.number(minDigits: 2, maxDigits: 2), h <= 24, m < 60, s < 61
            else { return nil }
            (hour, minute, second) = (h, m, s)
            if scanner.consume(".") {
                var digits = 0
                while let digit = scanner.digit() {
                    if digits < 6 { micros = micros * 10 + digit }
                    digits += 1
                }
                guard digits > 0 else { return nil }
                for _ in digits..<max(digits, 6) { micros *= 10 }
            }
            if let sign = scanner.sign() {
                guard let offsetHours = scanner.number(minDigits: 2, maxDigits: 2) else { return nil }
                var offsetSeconds = offsetHours * 3600
                if scanner.consume(":") {
                    guard let offsetMinutes = scanner.number(minDigits: 2, maxDigits: 2) else { return nil }
                    offsetSeconds += offsetMinutes * 60
                    if scanner.consume(":") {
                        guard let extra = scanner.number(minDigits: 2, maxDigits: 2) else { return nil }
                        offsetSeconds += extra
                    }
                }
                offset = sign * offsetSeconds
            }
        }
        if scanner.consume(" BC") { year = 1 - year }
        guard scanner.atEnd else { return nil }

        let days = daysFromCivil(year: year, month: month, day: day)
        let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset
        return Date(timeIntervalSince1970: Double(seconds) + Double(micros) / 1_000_000)
    }
}

extension Array: PostgresDecodable where Element == UInt8 {
    package static var quotesTextInErrors: Bool { false }

    /// bytea in hex output (`\x00ff…`), or the legacy escape output (`\000`, `\\`, printable ASCII).
    package static func decode(postgresText text: UnsafeBufferPointer<UInt8>) -> [UInt8]? {
        let backslash = UInt8(ascii: "\\")
        if text.count >= 2, text[0] == backslash, text[1] == UInt8(ascii: "x") {
            guard text.count % 2 == 0 else { return nil }
            var bytes = [UInt8]()
            bytes.reserveCapacity((text.count - 2) / 2)
            var index = 2
            while index < text.count {
                guard let high = hexValue(text[index]), let low = hexValue(text[index + 1]) else { return nil }
                bytes.append(high << 4 | low)
                index += 2
            }
            return bytes
        }
        var bytes = [UInt8]()
        bytes.reserveCapacity(text.count)
        var index = 0
        while index < text.count {
            let byte = text[index]
            if byte != backslash {
                bytes.append(byte)
                index += 1
            } else if index + 1 < text.count, text[index + 1] == backslash {
                bytes.append(backslash)
                index += 2
            } else if index + 3 < text.count, let value = octal(text[index + 1], text[index + 2], text[index + 3]) {
                bytes.append(value)
                index += 4
            } else {
                return nil
            }
        }
        return bytes
    }
}

private func hexValue(_ byte: UInt8) -> UInt8? {
    switch byte {
    case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
    case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
    case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
    default: nil
    }
}

private func octal(_ a: UInt8, _ b: UInt8, _ c: UInt8) -> UInt8? {
    let zero = UInt8(ascii: "0")
    guard (zero...zero + 3).contains(a), (zero...zero + 7).contains(b), (zero...zero + 7).contains(c) else {
        return nil
    }
    return (a - zero) << 6 | (b - zero) << 3 | (c - zero)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
func daysFromCivil(year: Int64, month: Int64, day: Int64) -> Int64 {
    let y = month <= 2 ? year - 1 : year
    let era = (y >= 0 ? y : y - 399) / 400
    let yearOfEra = y - era * 400
    let dayOfYear = (153 * (month > 2 ? month - 3 : month + 9) + 2) / 5 + day - 1
    let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
    return era * 146_097 + dayOfEra - 719_468
}

/// A cursor over ASCII text for the timestamp parser.
private struct ByteScanner {
    let text: UnsafeBufferPointer<UInt8>
    var index = 0

    init(_ text: UnsafeBufferPointer<UInt8>) { self.text = text }

    var atEnd: Bool { index == text.count }

    mutating func consume(_ literal: StaticString) -> Bool {
        let count = literal.utf8CodeUnitCount
        guard text.count - index >= count else { return false }
        let literalBytes = UnsafeBufferPointer(start: literal.utf8Start, count: count)
        for offset in 0..<count where text[index + offset] != literalBytes[offset] { return false }
        index += count
        return true
    }

    mutating func digit() -> Int64? {
        guard index < text.count else { return nil }
        let value = text[index] &- UInt8(ascii: "0")
        guard value < 10 else { return nil }
        index += 1
        return Int64(value)
    }

    mutating func number(minDigits: Int, maxDigits: Int) -> Int64? {
        var value: Int64 = 0
        var digits = 0
        while digits < maxDigits, let next = digit() {
            value = value * 10 + next
            digits += 1
        }
        return digits >= minDigits ? value : nil
    }

    mutating func sign() -> Int64? {
        if consume("+") { return 1 }
        if consume("-") { return -1 }
        return nil
    }
}
