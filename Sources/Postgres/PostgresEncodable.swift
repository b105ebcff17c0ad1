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
    /// `text[]` in binary: a length before each element, so nothing is escaped on either side
    /// (the receiver binds kilobytes of JWS and claims per commit this way).
    package static var postgresArrayType: UInt32 { PostgresType.textArray }
    package static func encode(_ elements: [String], into binds: inout PostgresBindings) {
        if let index = elements.firstIndex(where: containsNUL) {
            binds.refuse("element \(index + 1) of parameter $\(binds.count + 1) contains a NUL byte, which PostgreSQL text cannot hold")
        }
        binds.appendBinary(type: postgresArrayType) { buffer in
            appendArrayHeader(elementType: PostgresType.text, count: elements.count, to: &buffer)
            for element in elements {
                appendBigEndian(Int32(element.utf8.count), to: &buffer)
                buffer.append(contentsOf: element.utf8)
            }
        }
    }
}

extension Int64: PostgresArrayElement {
    package static var postgresArrayType: UInt32 { PostgresType.int8Array }
    package static func encode(_ elements: [Int64], into binds: inout PostgresBindings) {
        binds.appendBinary(type: postgresArrayType) { buffer in
            appendArrayHeader(elementType: PostgresType.int8, count: elements.count, to: &buffer)
            for element in elements {
                appendBigEndian(Int32(8), to: &buffer)
                appendBigEndian(UInt64(bitPattern: element), to: &buffer)
            }
        }
    }
}

/// The binary array header (`array_send`): dimensions, no-NULLs flag, element type, then one
/// dimension's length and lower bound 1. An empty array has no dimensions.
func appendArrayHeader(elementType: UInt32, count: Int, to buffer: inout [UInt8]) {
    appendBigEndian(Int32(count == 0 ? 0 : 1), to: &buffer)
    appendBigEndian(Int32(0), to: &buffer)
    appendBigEndian(elementType, to: &buffer)
    if count > 0 {
        appendBigEndian(Int32(count), to: &buffer)
        appendBigEndian(Int32(1), to: &buffer)
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

/// Whether `text` holds a U+0000, which PostgreSQL text cannot store. Scans native strings with
/// `memchr`: the receiver checks kilobytes of JWS per batch on its one committer thread.
func containsNUL(_ text: String) -> Bool {
    text.utf8.withContiguousStorageIfAvailable { bytes in
        guard let base = bytes.baseAddress else { return false }
        return memchr(base, 0, bytes.count) != nil
    } ?? text.utf8.contains(0)
}
