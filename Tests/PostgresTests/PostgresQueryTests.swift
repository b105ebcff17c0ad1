import Foundation
import Postgres
import Testing

@Suite struct PostgresQueryTests {
    @Test func interpolationBecomesNumberedPlaceholders() {
        let id: Int64 = 5
        let name = "x"
        let query: PostgresQuery = "SELECT * FROM t WHERE id = \(id) AND name = \(name) OR id = \(id)"
        #expect(query.sql == "SELECT * FROM t WHERE id = $1 AND name = $2 OR id = $3")
        #expect(query.binds.count == 3)
        #expect(query.binds[0] == .binary([0, 0, 0, 0, 0, 0, 0, 5], type: PostgresType.int8))
        #expect(query.binds[1] == .text("x", type: PostgresType.unknown))
        #expect(query.binds[2] == query.binds[0])
        #expect(!query.description.contains("\"x\""))
    }

    @Test func scalarEncodings() {
        let query: PostgresQuery = "\(Int32(-2)) \(true) \(false) \(1.0) \(Int(-1)) \(Date(timeIntervalSince1970: 946_684_801.5))"
        #expect(query.sql == "$1 $2 $3 $4 $5 $6")
        #expect(query.binds.values == [
            .binary([0xff, 0xff, 0xff, 0xfe], type: PostgresType.int4),
            .binary([1], type: PostgresType.bool),
            .binary([0], type: PostgresType.bool),
            .binary([0x3f, 0xf0, 0, 0, 0, 0, 0, 0], type: PostgresType.float8),
            .binary([0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff], type: PostgresType.int8),
            // 1.5 s after 2000-01-01 = 1_500_000 µs = 0x16E360
            .binary([0, 0, 0, 0, 0, 0x16, 0xe3, 0x60], type: PostgresType.timestamptz),
        ])
    }

    @Test func nilBindsNull() {
        let missing: String? = nil
        let count: Int64? = nil
        let bytes: [UInt8]? = nil
        let present: Int? = 7
        let query: PostgresQuery = "INSERT INTO t VALUES (\(missing), \(count), \(bytes), \(present))"
        #expect(query.sql == "INSERT INTO t VALUES ($1, $2, $3, $4)")
        #expect(query.binds[0] == .null(type: PostgresType.unknown))
        #expect(query.binds[1] == .null(type: PostgresType.int8))
        #expect(query.binds[2] == .null(type: PostgresType.bytea))
        #expect(query.binds[3] == .binary([0, 0, 0, 0, 0, 0, 0, 7], type: PostgresType.int8))
    }

    @Test func unsafeSQLIsNotBound() {
        let table = "events"
        let query: PostgresQuery = "SELECT count(*) FROM \(unsafeSQL: table) WHERE jti = \("a")"
        #expect(query.sql == "SELECT count(*) FROM events WHERE jti = $1")
        #expect(query.binds.count == 1)
        #expect(PostgresQuery(unsafeSQL: "SELECT 1").binds.count == 0)
        let literal: PostgresQuery = "SELECT '$1'"
        #expect(literal.sql == "SELECT '$1'" && literal.binds.count == 0)
        #expect(postgresQuoteIdentifier("we\"ird") == "\"we\"\"ird\"")
    }

    @Test func builderAppendsPlaceholders() {
        var query = PostgresQuery(unsafeSQL: "INSERT INTO t (a, b) VALUES ")
        for row in 0..<2 {
            if row > 0 { query.append(unsafeSQL: ", ") }
            query.append(unsafeSQL: "(")
            query.append(bind: Int64(row))
            query.append(unsafeSQL: ", ")
            query.append(bind: String?.none)
            query.append(unsafeSQL: ")")
        }
        #expect(query.sql == "INSERT INTO t (a, b) VALUES ($1, $2), ($3, $4)")
        #expect(query.binds.count == 4)
    }

    @Test func arraysBindInBinaryWithLengthsNotEscapes() {
        let query: PostgresQuery = "SELECT \(["a", "b\"c"]), \([Int64]([-3])), \([String]())"
        let header: [UInt8] = [0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 25, 0, 0, 0, 2, 0, 0, 0, 1]
        let elements: [UInt8] = [0, 0, 0, 1, UInt8(ascii: "a"), 0, 0, 0, 3, UInt8(ascii: "b"), UInt8(ascii: "\""), UInt8(ascii: "c")]
        #expect(query.binds[0] == .binary(header + elements, type: PostgresType.textArray))
        let int8: [UInt8] = [0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 20, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 8]
        #expect(query.binds[1] == .binary(int8 + [0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFD], type: PostgresType.int8Array))
        #expect(query.binds[2] == .binary([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 25], type: PostgresType.textArray))
        #expect(query.binds.invalidReason == nil)
        let withNUL: PostgresQuery = "\(["ok", "a\u{0}b"])"
        #expect(withNUL.binds.invalidReason?.contains("element 2 of parameter $1") == true)
    }

    @Test func byteaBindsBinaryWithZeroBytes() {
        let query: PostgresQuery = "\([UInt8]([0, 0, 255])) \([UInt8]())"
        #expect(query.binds[0] == .binary([0, 0, 255], type: PostgresType.bytea))
        #expect(query.binds[1] == .binary([], type: PostgresType.bytea))
    }

    @Test func stringsWithNULAreRejected() {
        let fine: PostgresQuery = "\("ok")"
        #expect(fine.binds.invalidReason == nil)
        let bad: PostgresQuery = "\("a\u{0}b")"
        #expect(bad.binds.invalidReason != nil)
        // In an array, whether the element is a small (inline) string, a large native one, or
        // bridged from Foundation; the reason names the element.
        let long = String(repeating: "x", count: 5000)
        for elements in [["ok", "a\u{0}"], [long, long + "\u{0}"], ["ok", NSString(string: "b\u{0}c") as String]] {
            let query: PostgresQuery = "SELECT \(elements)::text[]"
            #expect(query.binds.invalidReason?.contains("element 2 of parameter $1") == true, "\(elements.map(\.count))")
        }
        let clean: PostgresQuery = "SELECT \([long, "ok", NSString(string: "fine") as String])::text[]"
        #expect(clean.binds.invalidReason == nil)
    }
}
