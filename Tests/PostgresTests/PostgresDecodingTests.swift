import Foundation
import Postgres
import Testing

@Suite struct PostgresDecodingTests {
    @Test func timestamps() throws {
        let expected = try #require(Date.decode(postgresText: "2026-11-30 04:24:44+00"))
        #expect(expected.timeIntervalSince1970 == 1_796_012_684)
        let fraction = try #require(Date.decode(postgresText: "2026-11-30 04:24:44.123456+00"))
        #expect(abs(fraction.timeIntervalSince1970 - 1_796_012_684.123456) < 0.000_000_5)
        #expect(Date.decode(postgresText: "2026-11-30 04:24:44.5+00")?.timeIntervalSince1970 == 1_796_012_684.5)
        #expect(Date.decode(postgresText: "2026-11-30 06:24:44+02") == expected)
        #expect(Date.decode(postgresText: "2026-11-29 22:54:44-05:30") == expected)
        #expect(Date.decode(postgresText: "2026-11-30 04:24:44") == expected)  // timestamp without time zone
        #expect(Date.decode(postgresText: "1970-01-01")?.timeIntervalSince1970 == 0)
        #expect(Date.decode(postgresText: "2000-01-01 00:00:00+00")?.timeIntervalSince1970 == 946_684_800)
        #expect(Date.decode(postgresText: "1969-12-31 23:59:59+00")?.timeIntervalSince1970 == -1)
        #expect(Date.decode(postgresText: "2024-02-29 12:00:00+00")?.timeIntervalSince1970 == 1_709_208_000)
        #expect(Date.decode(postgresText: "infinity") == .distantFuture)
        #expect(Date.decode(postgresText: "-infinity") == .distantPast)
        #expect(Date.decode(postgresText: "0001-01-01 00:00:00+00 BC") != nil)
        for bad in ["", "2026-11-30 04:24", "2026-13-01", "2026-11-30 04:24:44+", "2026-11-30 04:24:44.+00", "now"] {
            #expect(Date.decode(postgresText: bad) == nil, "\(bad)")
        }
    }

    @Test func integersAndBooleansAndDoubles() {
        #expect(Int64.decode(postgresText: "9223372036854775807") == .max)
        #expect(Int64.decode(postgresText: "-9223372036854775808") == .min)
        #expect(Int64.decode(postgresText: "9223372036854775808") == nil)
        #expect(Int64.decode(postgresText: "12a") == nil)
        #expect(Int64.decode(postgresText: "") == nil)
        #expect(Int64.decode(postgresText: "-") == nil)
        #expect(Int32.decode(postgresText: "2147483648") == nil)
        #expect(Int.decode(postgresText: "-42") == -42)
        #expect(Bool.decode(postgresText: "t") == true)
        #expect(Bool.decode(postgresText: "f") == false)
        #expect(Bool.decode(postgresText: "true") == nil)
        #expect(Double.decode(postgresText: "1.5e-07") == 1.5e-7)
        #expect(Double.decode(postgresText: "Infinity") == .infinity)
        #expect(Double.decode(postgresText: "-Infinity") == -.infinity)
        #expect(Double.decode(postgresText: "NaN")?.isNaN == true)
        #expect(String.decode(postgresText: "日本") == "日本")
    }

    @Test func bytea() {
        #expect([UInt8].decode(postgresText: "\\x") == [])
        #expect([UInt8].decode(postgresText: "\\x00ff10Ab") == [0, 255, 16, 0xab])
        #expect([UInt8].decode(postgresText: "\\x0") == nil)
        #expect([UInt8].decode(postgresText: "\\xzz") == nil)
        #expect([UInt8].decode(postgresText: "a\\000\\\\b") == [0x61, 0, 0x5c, 0x62])  // escape format
        #expect([UInt8].quotesTextInErrors == false)
        #expect(String.quotesTextInErrors)
    }
}

@Suite struct PostgresErrorTests {
    @Test func descriptionIsRedacted() {
        let error = PostgresError(
            .queryFailed, message: "invalid input syntax for type bigint: \"secret\"", sqlState: "22P02",
            detail: "Key (jti)=(secret) already exists.", query: "INSERT INTO t VALUES ($1)")
        #expect(!error.description.contains("secret"))
        #expect(!error.description.contains("INSERT"))
        #expect(error.description.contains("22P02"))
        #expect(error.debugDescription.contains("secret"))
        #expect(error.debugDescription.contains("INSERT INTO t"))
    }

    @Test func classification() {
        #expect(PostgresError(.queryFailed, message: "", sqlState: "23505").isUniqueViolation)
        #expect(!PostgresError(.queryFailed, message: "", sqlState: "23503").isUniqueViolation)
        for state in ["08006", "08001", "57P01", "57P02", "57P03", "25006"] {
            #expect(PostgresError(.queryFailed, message: "", sqlState: state).isConnectionProblem, "\(state)")
        }
        #expect(!PostgresError(.queryFailed, message: "", sqlState: "57014").isConnectionProblem)
        #expect(PostgresError(.connectionLost, message: "").isConnectionProblem)
        #expect(PostgresError(.connectionFailed, message: "").isConnectionProblem)
        #expect(!PostgresError(.timeout, message: "").isConnectionProblem)
        let error: any Error = PostgresError(.connectionLost, message: "")
        #expect(error.isPostgresConnectionProblem)
    }
}
