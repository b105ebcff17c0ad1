import Postgres
import SiwaModel
import Testing

/// Statuses are read from the database as `AccountStatus`, never as strings: a value the enum does
/// not know (a newer migration's status, a typo in a function) is an error that says which column,
/// which value and which type, not a string that slips past every comparison.
@Suite struct AccountStatusDecodingTests {
    @Test func everyStatusDecodesAndAnUnknownOneIsAnErrorWithItsContext() async throws {
        let database = try await LifecycleHarness.makeDatabase()
        let connection = try await database.connect()
        defer { connection.close() }
        for status in AccountStatus.allCases {
            let row = try await connection.query("SELECT \(status.rawValue)::text AS status")[0]
            #expect(try row.decode(AccountStatus.self, column: "status") == status)
            #expect(try row.decode(AccountStatus?.self, column: "status") == status)
            #expect(try row.decode(AccountStatus.self, at: 0) == status)
        }
        #expect(try await connection.query("SELECT NULL::text AS status")[0].decode(AccountStatus?.self, column: "status") == nil)

        let unknown = try await connection.query("SELECT 'frozen'::text AS status")[0]
        let decoders: [() throws -> AccountStatus] = [
            { try unknown.decode(AccountStatus.self, column: "status") }, { try unknown.decode(AccountStatus.self, at: 0) },
        ]
        for decode in decoders {
            let error = try #require(throws: PostgresError.self) { _ = try decode() }
            #expect(error.code == .decodingFailed)
            #expect(error.column == "status")
            #expect(error.message.contains("\"frozen\"") && error.message.contains("AccountStatus"), "\(error.message)")
        }
        await database.drop()
    }
}
