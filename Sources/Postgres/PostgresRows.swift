internal import CLibpq

/// Owns one `PGresult`.
// @unchecked Sendable: the pointer is immutable and a PGresult is read-only after creation; libpq
// documents that results may be read from several threads. PQclear runs once, in deinit.
final class PostgresResult: @unchecked Sendable {
    let pointer: OpaquePointer
    let rowCount: Int
    let columnNames: [String]
    private let columnIndexes: [String: Int]

    /// Takes ownership of `pointer` (freed with PQclear in deinit).
    init(taking pointer: OpaquePointer) {
        self.pointer = pointer
        rowCount = Int(PQntuples(pointer))
        let columnCount = Int(PQnfields(pointer))
        var names = [String]()
        names.reserveCapacity(columnCount)
        var indexes = [String: Int](minimumCapacity: columnCount)
        for column in 0..<columnCount {
            let name = PQfname(pointer, Int32(column)).map { String(cString: $0) } ?? ""
            names.append(name)
            if indexes[name] == nil { indexes[name] = column }
        }
        columnNames = names
        columnIndexes = indexes
    }

    deinit { PQclear(pointer) }

    func columnIndex(_ name: String) -> Int? { columnIndexes[name] }

    func isNull(row: Int, column: Int) -> Bool {
        PQgetisnull(pointer, Int32(row), Int32(column)) == 1
    }

    /// The text of one value; valid while `self` lives. nil for NULL.
    func withText<T>(row: Int, column: Int, _ body: (UnsafeBufferPointer<UInt8>?) throws -> T) rethrows -> T {
        if isNull(row: row, column: column) { return try body(nil) }
        let length = Int(PQgetlength(pointer, Int32(row), Int32(column)))
        let start = UnsafeRawPointer(PQgetvalue(pointer, Int32(row), Int32(column))!)
        return try body(UnsafeBufferPointer(start: start.assumingMemoryBound(to: UInt8.self), count: length))
    }
}

/// The rows a query returned, decoded lazily from libpq's result.
package struct PostgresRows: Sendable, RandomAccessCollection {
    let result: PostgresResult?
    /// Rows inserted/updated/deleted/selected, from the command tag (0 when it carries none).
    package let affectedRows: Int

    init(result: PostgresResult?, affectedRows: Int) {
        self.result = result
        self.affectedRows = affectedRows
    }

    package var columns: [String] { result?.columnNames ?? [] }
    package var startIndex: Int { 0 }
    package var endIndex: Int { result?.rowCount ?? 0 }

    package subscript(position: Int) -> PostgresRow {
        precondition(position >= 0 && position < endIndex, "row index out of range")
        return PostgresRow(result: result!, index: position)
    }
}

package struct PostgresRow: Sendable {
    let result: PostgresResult
    package let index: Int

    package var columns: [String] { result.columnNames }

    /// The index of the column named `name` (the first one, if names repeat).
    package func columnIndex(_ name: String) throws -> Int {
        guard let column = result.columnIndex(name) else {
            throw PostgresError(.decodingFailed, message: "no column named \"\(name)\" in the result", column: name)
        }
        return column
    }

    package func isNull(column name: String) throws -> Bool {
        result.isNull(row: index, column: try columnIndex(name))
    }

    package func decode<T: PostgresDecodable>(_ type: T.Type, column name: String) throws -> T {
        try decode(type, at: try columnIndex(name))
    }

    package func decode<T: PostgresDecodable>(_ type: T?.Type, column name: String) throws -> T? {
        try decode(type, at: try columnIndex(name))
    }

    package func decode<T: PostgresDecodable>(_ type: T.Type, at column: Int) throws -> T {
        guard let value = try decode(T?.self, at: column) else {
            throw PostgresError(
                .decodingFailed, message: "column \(describe(column)) is NULL; decode \(T.self)? to allow it",
                column: name(of: column))
        }
        return value
    }

    package func decode<T: PostgresDecodable>(_ type: T?.Type, at column: Int) throws -> T? {
        guard column >= 0, column < result.columnNames.count else {
            throw PostgresError(.decodingFailed, message: "no column at index \(column)")
        }
        return try result.withText(row: index, column: column) { text -> T? in
            guard let text else { return nil }
            if let value = T.decode(postgresText: text) { return value }
            let saw =
                T.quotesTextInErrors
                ? "\"\(String(decoding: text.prefix(80), as: UTF8.self))\"\(text.count > 80 ? "…" : "")"
                : "\(text.count) bytes of text"
            throw PostgresError(
                .decodingFailed, message: "column \(describe(column)): cannot decode \(T.self) from \(saw)",
                column: name(of: column))
        }
    }

    private func name(of column: Int) -> String { result.columnNames[column] }
    private func describe(_ column: Int) -> String { "\"\(name(of: column))\" (index \(column))" }
}
