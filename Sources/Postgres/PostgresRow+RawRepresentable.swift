/// A column holding one of an enum's raw values (`AccountStatus` from `siwa.accounts.status`): the
/// raw value is decoded as usual, and one the enum does not know is a `decodingFailed` error naming
/// the column, the value (when its type may be quoted) and the type, like any other decoding error.
extension PostgresRow {
    package func decode<T: RawRepresentable>(_ type: T.Type, column name: String) throws -> T where T.RawValue: PostgresDecodable {
        try value(T.self, from: try decode(T.RawValue.self, column: name), column: name)
    }

    package func decode<T: RawRepresentable>(_ type: T?.Type, column name: String) throws -> T? where T.RawValue: PostgresDecodable {
        try decode(T.RawValue?.self, column: name).map { try value(T.self, from: $0, column: name) }
    }

    package func decode<T: RawRepresentable>(_ type: T.Type, at column: Int) throws -> T where T.RawValue: PostgresDecodable {
        try value(T.self, from: try decode(T.RawValue.self, at: column), column: columns[column])
    }

    private func value<T: RawRepresentable>(_ type: T.Type, from raw: T.RawValue, column: String) throws -> T
    where T.RawValue: PostgresDecodable {
        if let value = T(rawValue: raw) { return value }
        let saw = T.RawValue.quotesTextInErrors ? "\"\(String(describing: raw).prefix(80))\"" : "a value"
        throw PostgresError(.decodingFailed, message: "column \"\(column)\": \(saw) is no \(T.self)", column: column)
    }
}
