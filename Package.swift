// swift-tools-version:6.1
import PackageDescription

// Every target gets the same strictness: no implicit existentials, imports that are
// internal unless said otherwise (so C types never leak), and member lookups only
// through modules a file actually imports.
let strict: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("InternalImportsByDefault"),
    .enableUpcomingFeature("MemberImportVisibility"),
]

let package = Package(
    name: "siwa-notifications",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "siwa-receiver", targets: ["siwa-receiver"]),
        .executable(name: "siwa-worker", targets: ["siwa-worker"]),
        .executable(name: "siwa", targets: ["siwa"]),
    ],
    targets: [
        // C libraries from Debian, each imported by exactly one Swift module.
        .systemLibrary(name: "CLibpq", pkgConfig: "libpq", providers: [.apt(["libpq-dev"])]),
        .systemLibrary(name: "COpenSSL", pkgConfig: "libcrypto", providers: [.apt(["libssl-dev"])]),
        .systemLibrary(name: "CMicroHTTPD", pkgConfig: "libmicrohttpd", providers: [.apt(["libmicrohttpd-dev"])]),
        .systemLibrary(name: "CCurl", pkgConfig: "libcurl", providers: [.apt(["libcurl4-openssl-dev"])]),

        // Thin wrappers: the only code that sees a C pointer.
        .target(name: "Logging", exclude: ["README.md"], swiftSettings: strict),
        .target(name: "Locking", exclude: ["README.md"], swiftSettings: strict),
        .target(name: "Postgres", dependencies: ["Locking", "CLibpq", "Logging"], exclude: ["README.md"], swiftSettings: strict),
        .target(name: "CryptoCore", dependencies: ["COpenSSL"], exclude: ["README.md"], swiftSettings: strict),
        .target(name: "HTTPServer", dependencies: ["Locking", "CMicroHTTPD", "Logging"], exclude: ["README.md"], swiftSettings: strict),
        // The one HTTP client of every call out (Apple, webhooks, the CLI), over libcurl.
        .target(name: "OutboundHTTP", dependencies: ["Locking", "CCurl"], exclude: ["README.md"], swiftSettings: strict),

        // Building blocks.
        .target(name: "JSON", exclude: ["README.md"], swiftSettings: strict),
        .target(name: "JOSE", dependencies: ["CryptoCore", "JSON"], exclude: ["README.md"], swiftSettings: strict),
        // The one way a child process is started, signalled and reaped, and the watchdog that stops
        // what is left when we die.
        .target(name: "ChildProcesses", dependencies: ["Locking"], exclude: ["README.md"], swiftSettings: strict),
        .target(name: "LocalPostgres", dependencies: ["ChildProcesses", "Locking", "Logging"], exclude: ["README.md"], swiftSettings: strict),
        // Configuration: flags, environment and `X_FILE` sources, the catalog of every setting, its documents.
        .target(name: "Settings", dependencies: ["Logging"], exclude: ["README.md"], swiftSettings: strict),
        // The Prometheus registry: counters, gauges, histograms.
        .target(name: "Metrics", dependencies: ["Locking"], exclude: ["README.md"], swiftSettings: strict),
        // Process lifecycle: SIGTERM/SIGINT and the one `Service` shape both mains run.
        .target(name: "Lifecycle", dependencies: ["Logging"], exclude: ["README.md"], swiftSettings: strict),
        // The domain model: Apple's notification, account statuses.
        .target(name: "SiwaModel", dependencies: ["JSON"], exclude: ["README.md"], swiftSettings: strict),
        // sql/ embedded at build time (the EmbedSQL plugin runs embed-sql), and the migrator that
        // applies it.
        .target(name: "Migrations", dependencies: ["Logging", "Postgres"], exclude: ["README.md"], resources: [.process("SQL")],
                swiftSettings: strict, plugins: ["EmbedSQLPlugin"]),
        .executableTarget(name: "embed-sql", exclude: ["README.md"], swiftSettings: strict),
        .plugin(name: "EmbedSQLPlugin", capability: .buildTool(), dependencies: ["embed-sql"], path: "Sources/EmbedSQLPlugin", exclude: ["README.md"]),
        .target(name: "AppleClient", dependencies: ["Locking", "JOSE", "CryptoCore", "Logging", "JSON", "OutboundHTTP", "Metrics", "SiwaModel"], exclude: ["README.md"], swiftSettings: strict),
        .target(name: "JobQueue", dependencies: ["Postgres", "Logging"], exclude: ["README.md"], swiftSettings: strict),
        // Refresh tokens at rest: sealed with SIWA_TOKEN_KEYS (TokenBox), imported, re-sealed under a new key.
        .target(name: "StoredTokens", dependencies: ["CryptoCore", "Postgres"], exclude: ["README.md"], swiftSettings: strict),
        // An account as its readers show it (the app API, the console): siwa.account's columns, decoded once.
        .target(name: "Accounts", dependencies: ["JSON", "Postgres", "SiwaModel"], exclude: ["README.md"], swiftSettings: strict),

        // Application logic.
        .target(name: "ReceiverCore",
                dependencies: ["Locking", "Postgres", "JOSE", "CryptoCore", "HTTPServer", "Logging", "AppleClient", "JSON", "Lifecycle", "Metrics", "Settings", "SiwaModel"],
                exclude: ["README.md"], swiftSettings: strict),
        // The Apple-calling job handlers (exchange, revoke, reconcile) and their shared context.
        .target(name: "AppleJobs",
                dependencies: ["AppleClient", "JobQueue", "Logging", "Postgres", "Metrics", "Settings", "SiwaModel", "StoredTokens"],
                exclude: ["README.md"], swiftSettings: strict),
        // The app API: its server, routes, answers, sign-in and SQL calls.
        .target(name: "AppAPI",
                dependencies: ["Accounts", "AppleClient", "AppleJobs", "CryptoCore", "HTTPServer", "JOSE", "JSON", "Locking", "Logging", "Postgres", "Metrics", "Settings", "SiwaModel", "StoredTokens"],
                exclude: ["README.md"], swiftSettings: strict),
        // Webhooks: the queue, the dispatcher, signatures, the transports (retry and discard: siwa.webhook_retry).
        .target(name: "Webhooks",
                dependencies: ["CryptoCore", "JobQueue", "Locking", "Logging", "OutboundHTTP", "Postgres", "Metrics", "Settings"],
                exclude: ["README.md"], swiftSettings: strict),
        // Team transfer (`siwa accounts transfer`): the file, export, import, Apple's migration calls.
        .target(name: "TeamTransfer", dependencies: ["AppleClient", "JobQueue", "Logging", "Postgres"],
                exclude: ["README.md"], swiftSettings: strict),
        // The worker: its loops, its ops server, and the services it starts.
        .target(name: "WorkerCore",
                dependencies: ["AppAPI", "AppleClient", "AppleJobs", "HTTPServer", "JOSE", "JobQueue", "Locking", "Logging", "Postgres", "Webhooks", "Metrics", "Settings", "SiwaModel", "Lifecycle"],
                exclude: ["README.md"], swiftSettings: strict),
        // The operator console's pages and actions (`siwa console`, `siwa dev`).
        .target(name: "Console", dependencies: ["Accounts", "CryptoCore", "HTTPServer", "JobQueue", "Locking", "Logging", "Postgres", "Webhooks", "Settings", "SiwaModel"],
                exclude: ["README.md"], swiftSettings: strict),
        .target(name: "FakeApple", dependencies: ["Locking", "JOSE", "CryptoCore", "HTTPServer", "Logging", "AppleClient", "Metrics"],
                exclude: ["README.md"], swiftSettings: strict),

        // Executables: load configuration, run.
        // Every dependency list here is exact: each module a target's files import, and no other
        // (`--explicit-target-dependency-import-check error` enforces the first half only; see
        // deploy/check/package-deps.sh for the second).
        .executableTarget(name: "siwa-receiver", dependencies: ["ReceiverCore", "Logging", "Lifecycle", "Settings"],
                          exclude: ["README.md"], swiftSettings: strict),
        .executableTarget(name: "siwa-worker", dependencies: ["WorkerCore", "AppleJobs", "Logging", "Lifecycle", "Settings"],
                          exclude: ["README.md"], swiftSettings: strict),
        // The operator CLI's commands (`siwa migrate`, `status`, `jobs`, `dev`, ...), their help and flag checks.
        .target(name: "OperatorCommands",
                dependencies: ["ChildProcesses", "Locking", "Migrations", "Postgres", "LocalPostgres", "FakeApple", "JobQueue", "CryptoCore", "Logging", "TeamTransfer", "Webhooks", "AppleClient", "HTTPServer", "OutboundHTTP", "Console", "Lifecycle", "Settings", "Metrics", "StoredTokens"],
                exclude: ["README.md"], swiftSettings: strict),
        .executableTarget(name: "siwa", dependencies: ["OperatorCommands"], exclude: ["README.md"], swiftSettings: strict),

        // The receiver's decoding path as a libFuzzer target: deploy/fuzz/run.sh builds it with
        // -sanitize=fuzzer,address; a plain build keeps it compiling (replay / make-corpus modes).
        .executableTarget(name: "SiwaFuzz", dependencies: ["ReceiverCore", "AppleClient", "CryptoCore", "JOSE", "Logging"],
                          path: "Fuzz/SiwaFuzz", exclude: ["Fixtures"], swiftSettings: strict),

        // Unit tests: no network, no database.
        .testTarget(name: "SettingsTests", dependencies: ["Settings", "Metrics"], swiftSettings: strict),
        .testTarget(name: "SiwaModelTests", dependencies: ["SiwaModel"], swiftSettings: strict),
        .testTarget(name: "MigrationsTests", dependencies: ["Migrations"], swiftSettings: strict),
        .testTarget(name: "CryptoCoreTests", dependencies: ["CryptoCore"], swiftSettings: strict),
        .testTarget(name: "JSONTests", dependencies: ["JSON"], swiftSettings: strict),
        .testTarget(name: "JOSETests", dependencies: ["JOSE", "CryptoCore", "JSON"], swiftSettings: strict),
        .testTarget(name: "PostgresTests", dependencies: ["Postgres"], swiftSettings: strict),
        .testTarget(name: "HTTPServerTests", dependencies: ["HTTPServer", "OutboundHTTP", "TestTiming"], swiftSettings: strict),
        .testTarget(name: "OutboundHTTPTests", dependencies: ["OutboundHTTP", "ScriptedHTTPServer", "TestTiming"], swiftSettings: strict),
        .testTarget(name: "ReceiverCoreTests",
                    dependencies: ["ReceiverCore", "JOSE", "CryptoCore", "AppleClient", "HTTPServer", "Logging", "Metrics", "Settings", "SiwaModel"],
                    swiftSettings: strict),
        .testTarget(name: "JobQueueTests", dependencies: ["JobQueue"], swiftSettings: strict),
        .testTarget(name: "StoredTokensTests", dependencies: ["StoredTokens", "CryptoCore"], swiftSettings: strict),
        .testTarget(name: "AppleClientTests", dependencies: ["AppleClient", "JOSE", "CryptoCore", "ScriptedHTTPServer", "TestTiming"], swiftSettings: strict),
        .testTarget(name: "WorkerCoreTests", dependencies: ["ChildProcesses", "WorkerCore", "Webhooks", "TeamTransfer", "Locking", "Postgres", "ScriptedHTTPServer", "Settings", "TestTiming"],
                    swiftSettings: strict),
        // A TCP server that answers byte for byte as a test scripts it (for the HTTP clients' tests).
        // Over TLS too, with libssl (which no product links).
        .target(name: "ScriptedHTTPServer", dependencies: ["CLibssl", "TestTiming"], path: "Tests/ScriptedHTTPServer", swiftSettings: strict),
        .systemLibrary(name: "CLibssl", path: "Tests/CLibssl", pkgConfig: "libssl", providers: [.apt(["libssl-dev"])]),
        // SIWA_TEST_TIME_SCALE: the tests' bounds on a wait, scaled for the sanitizers' slowdown.
        .target(name: "TestTiming", path: "Tests/TestTiming", swiftSettings: strict),

        // Real PostgreSQL (started by the test support), real processes over HTTP.
        .testTarget(name: "IntegrationTests",
                    dependencies: ["Postgres", "ChildProcesses", "LocalPostgres", "Locking", "Migrations", "JOSE", "CryptoCore", "FakeApple", "JobQueue", "Logging", "HTTPServer", "AppleClient", "WorkerCore", "AppAPI", "AppleJobs", "TeamTransfer", "Webhooks", "OutboundHTTP", "ScriptedHTTPServer", "TestTiming", "Metrics", "Settings", "SiwaModel", "StoredTokens"],
                    swiftSettings: strict),
    ]
)
