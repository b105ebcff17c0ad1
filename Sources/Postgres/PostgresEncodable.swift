package import Foundation

/// PostgreSQL type OIDs used for binds (from `pg_type.dat`).
package enum PostgresType {
    package static let unknown: UInt32 = 0
    package static let bool: UInt32 = 16
    package static let bytea: UInt32 = 17
    package static let int8: UInt32 = 20
    package static let int4: UInt32 = 23
    package static let text: UInt32 = 25
    package static let float8: UInt32 = 701
    package static let textArray: UInt32 = 1009
    package static let int8Array: UInt32 = 1016
    package static let timestamptz: UInt32 = 1184
}

/// A Swift value that can be bound as a query parameter.
package protocol PostgresEncodable: Sendable {
    /// The OID declared for the parameter (0 lets the server infer it).
    static var postgresType: UInt32 { get }
    func encode(into binds: inout PostgresBindings)
}

extension String: PostgresEncodable {
    /// Unknown, so the server infers text, varchar, jsonb, uuid … from the context.
    package static var postgresType: UInt32 { PostgresType.unknown }
    package func encode(into binds: inout PostgresBindings) { binds.appendText(self, type: Self.postgresType) }
}

extension Int64: PostgresEncodable {
    package static var postgresType: UInt32 { PostgresType.int8 }
    package func encode(into binds: inout PostgresBindings) {
        binds.appendBinary(type: Self.postgresType) { appendBigEndian(UInt64(bitPattern: self), to: &$0) }
    }
}

extension Int: PostgresEncodable {
    package static var postgresType: UInt32 { PostgresType.int8 }
    package func encode(into binds: inout PostgresBindings) { Int64(self).encode(into: &binds) }
}

extension Int32: PostgresEncodable {
    package static var postgresType: UInt32 { PostgresType.int4 }
    package func encode(into binds: inout PostgresBindings) {
        binds.appendBinary(type: Self.postgresType) { appendBigEndian(UInt32(bitPattern: self), to: &$0) }
    }
}

extension Bool: PostgresEncodable {
    package static var postgresType: UInt32 { PostgresType.bool }
    package func encode(into binds: inout PostgresBindings) {
        binds.appendBinary(type: Self.postgresType) { $0.append(self ? 1 : 0) }
    }
}

extension Double: PostgresEncodable {
    package static var postgresType: UInt32 { PostgresType.float8 }
    package func encode(into binds: inout PostgresBindings) {
        binds.appendBinary(type: Self.postgresType) { appendBigEndian(self.bitPattern, to: &$0) }
    }
}

extension Date: PostgresEncodable {
    package static var postgresType: UInt32 { PostgresType.timestamptz }
    /// Binary timestamptz: microseconds since 2000-01-01 00:00:00 UTC.
    package func encode(into binds: inout PostgresBindings) {
        let micros = Int64(((timeIntervalSince1970 - postgresEpochOffset) * 1_000_000).rounded())
        binds.appendBinary(type: Self.postgresType) { appendBigEndian(UInt64(bitPattern: micros), to: &$0) }
    }
}

/// Seconds from 1970-01-01 to 2000-01-01, PostgreSQL's epoch.
let postgresEpochOffset: TimeInterval = 946_684_800

/// Element types of arrays that can be bound: `UInt8` (the array is bytea), `String`, `Int64`, `Int`.
package protocol PostgresArrayElement: Sendable {
    static var postgresArrayType: UInt32 { get }
    static func encode(_ elements: [Self], into binds: inout PostgresBindings)
}

extension Array: PostgresEncodable where Element: PostgresArrayElement {
    package static var postgresType: UInt32 { Element.postgresArrayType }
    package func encode(into binds: inout PostgresBindings) { Element.encode(self, into: &binds) }
}

extension UInt8: PostgresArrayElement {
    /// `[UInt8]` is bytea, sent in binary (no hex doubling, zero bytes allowed).
    package static var postgresArrayType: UInt32 { PostgresType.bytea }
    package static func encode(_ elements: [UInt8], into binds: inout PostgresBindings) {
        binds.appendBinary(elements, type: postgresArrayType)
    }
}

extension String: PostgresArrayElement {
    /// `text[]` literal: every element double-quoted, `"` and `\` backslash-escaped.
    package static var postgresArrayType: UInt32 { PostgresType.textArray }
    package static func encode(_ elements: [String], into binds: inout PostgresBindings) {
        binds.appendText(type: postgresArrayType) { buffer in
            buffer.append(UInt8(ascii: "{"))
            for (index, element) in elements.enumerated() {
                if index > 0 { buffer.append(UInt8(ascii: ",")) }
                buffer.append(UInt8(ascii: "\""))
                for byte in element.utf8 {
                    if byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") { buffer.append(UInt8(ascii: "\\")) }
                    buffer.append(byte)
                }
                buffer.append(UInt8(ascii: "\""))
            }
            buffer.append(UInt8(ascii: "}"))
        }
    }
}

extension Int64: PostgresArrayElement {
    package static var postgresArrayType: UInt32 { PostgresType.int8Array }
    package static func encode(_ elements: [Int64], into binds: inout PostgresBindings) {
        binds.appendText(type: postgresArrayType) { buffer in
            buffer.append(UInt8(ascii: "{"))
            for (index, element) in elements.enumerated() {
                if index > 0 { buffer.append(UInt8(ascii: ",")) }
                appendDecimal(element, to: &buffer)
            }
            buffer.append(UInt8(ascii: "}"))
        }
    }
}

extension Int: PostgresArrayElement {
    package static var postgresArrayType: UInt32 { PostgresType.int8Array }
    package static func encode(_ elements: [Int], into binds: inout PostgresBindings) {
        Int64.encode(elements.map { Int64($0) }, into: &binds)
    }
}

@inline(__always)
func appendBigEndian<T: FixedWidthInteger>(_ value: T, to buffer: inout [UInt8]) {
    var bigEndian = value.bigEndian
    withUnsafeBytes(of: &bigEndian) { buffer.append(contentsOf: $0) }
}

func appendDecimal(_ value: Int64, to buffer: inout [UInt8]) {
    if value < 0 { buffer.append(UInt8(ascii: "-")) }
    var magnitude = value.magnitude
    let start = buffer.count
    repeat {
        buffer.append(UInt8(ascii: "0") + UInt8(magnitude % 10))
        magnitude /= 10
    } while magnitude > 0
    buffer[start...].reverse()
}
