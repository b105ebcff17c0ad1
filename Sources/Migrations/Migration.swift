/// One numbered file of `sql/`, embedded in the binary at build time (the EmbedSQL plugin).
/// Numbered migrations change the schema (tables, columns, indexes, triggers, roles); once shipped
/// they are never edited.
package struct Migration: Sendable, Equatable {
    package var version: Int
    package var name: String
    package var sql: String

    package init(version: Int, name: String, sql: String) {
        self.version = version
        self.name = name
        self.sql = sql
    }
}

/// One file of `sql/functions/`: `CREATE OR REPLACE` definitions of functions, applied after the
/// numbered migrations whenever its text differs from the one last applied. A rule's history is
/// then the history of one file, not a chain of migrations that each re-create a function.
package struct FunctionDefinitions: Sendable, Equatable {
    /// The file name without `.sql`; files are applied in name order.
    package var name: String
    package var sql: String

    package init(name: String, sql: String) {
        self.name = name
        self.sql = sql
    }
}
