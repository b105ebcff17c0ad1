/// One numbered file of `sql/`, embedded in the binary by `deploy/scripts/embed-sql.sh`.
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
