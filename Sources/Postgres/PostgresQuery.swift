/// SQL text plus bound values, built by string interpolation (postgres-nio `PostgresQuery`):
///
///     let query: PostgresQuery = "SELECT * FROM events WHERE jti = \(jti) AND created_at > \(since)"
///
/// turns into `… WHERE jti = $1 AND created_at > $2` with two binds. Values are always bound, never
/// spliced into the text. Raw text needs an explicit label: `\(unsafeSQL: tableName)`.
///
/// Bound types: `String`, `Int`, `Int64`, `Int32`, `Bool`, `Double`, `Date` (timestamptz), `[UInt8]`
/// (bytea), `[String]` (`text[]`), `[Int64]` (`bigint[]`) and their optionals (`nil` is SQL NULL).
/// `String` is sent with type "unknown" so the server infers it (it fits text, jsonb, uuid columns);
/// write `$n::text` in the SQL where the context cannot tell (`\(name)::text IS NULL`).
package struct PostgresQuery: Sendable, Hashable, ExpressibleByStringInterpolation {
    package var sql: String
    package var binds: PostgresBindings

    package init(unsafeSQL sql: String, binds: PostgresBindings = PostgresBindings()) {
        self.sql = sql
        self.binds = binds
    }

    package init(stringLiteral value: String) {
        self.init(unsafeSQL: value)
    }

    package init(stringInterpolation: StringInterpolation) {
        self.init(unsafeSQL: stringInterpolation.sql, binds: stringInterpolation.binds)
    }

    /// Appends raw SQL text (for builders that assemble statements piece by piece).
    package mutating func append(unsafeSQL text: String) {
        sql += text
    }

    /// Binds `value` and appends its placeholder (`$n`).
    package mutating func append<Value: PostgresEncodable>(bind value: Value) {
        value.encode(into: &binds)
        appendPlaceholder()
    }

    /// Binds `value` (NULL when nil) and appends its placeholder.
    package mutating func append<Value: PostgresEncodable>(bind value: Value?) {
        if let value { value.encode(into: &binds) } else { binds.appendNull(type: Value.postgresType) }
        appendPlaceholder()
    }

    private mutating func appendPlaceholder() {
        sql += "$"
        sql += String(binds.count)
    }

    package struct StringInterpolation: StringInterpolationProtocol {
        var sql: String
        var binds: PostgresBindings

        package init(literalCapacity: Int, interpolationCount: Int) {
            sql = ""
            sql.reserveCapacity(literalCapacity + interpolationCount * 3)
            binds = PostgresBindings(capacity: interpolationCount)
        }

        package mutating func appendLiteral(_ literal: String) {
            sql += literal
        }

        package mutating func appendInterpolation<Value: PostgresEncodable>(_ value: Value) {
            value.encode(into: &binds)
            appendPlaceholder()
        }

        package mutating func appendInterpolation<Value: PostgresEncodable>(_ value: Value?) {
            if let value { value.encode(into: &binds) } else { binds.appendNull(type: Value.postgresType) }
            appendPlaceholder()
        }

        /// Raw SQL: identifiers, generated fragments. Never user input.
        package mutating func appendInterpolation(unsafeSQL text: String) {
            sql += text
        }

        private mutating func appendPlaceholder() {
            sql += "$"
            sql += String(binds.count)
        }
    }
}

extension PostgresQuery: CustomStringConvertible {
    /// The SQL text and the number of binds; never the bound values.
    package var description: String { "\(sql) [\(binds.count) binds]" }
}

/// Quotes an identifier (`"my ""table"""`) for `\(unsafeSQL:)` use with names that are not constants.
package func postgresQuoteIdentifier(_ name: String) -> String {
    var quoted = "\""
    for character in name {
        if character == "\"" { quoted.append("\"") }
        quoted.append(character)
    }
    return quoted + "\""
}
