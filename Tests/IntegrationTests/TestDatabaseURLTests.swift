import Testing

/// The helpers that rewrite `DATABASE_URL` for a test database keep every host of a multi-host URL
/// (`TEST_DATABASE_URL` may name a primary and its standby).
@Suite("Test database URLs")
struct TestDatabaseURLTests {
    @Test func databaseNameIsReplacedInMultiHostURLs() {
        #expect(
            MigratedDatabase.url("postgresql://postgres@127.0.0.1:5432,127.0.0.1:5433/siwa?target_session_attrs=read-write", database: "test_x")
                == "postgresql://postgres@127.0.0.1:5432,127.0.0.1:5433/test_x?target_session_attrs=read-write")
        #expect(MigratedDatabase.url("postgresql://h1,h2", database: "t") == "postgresql://h1,h2/t")
        #expect(MigratedDatabase.url("postgres://u@h:1/db", database: "t") == "postgres://u@h:1/t")
        #expect(MigratedDatabase.url("host=h1,h2 port=1,2 dbname=siwa", database: "t") == "host=h1,h2 port=1,2 dbname=t")
    }

    @Test func searchPathIsAddedToMultiHostURLs() {
        #expect(
            TestDatabase.conninfo("postgresql://h1:1,h2:2/siwa?target_session_attrs=read-write", searchPath: "test_s")
                == "postgresql://h1:1,h2:2/siwa?target_session_attrs=read-write&options=-csearch_path%3Dtest_s")
    }
}
