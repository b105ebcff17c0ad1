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

        // Thin wrappers: the only code that sees a C pointer.
        .target(name: "Logging", swiftSettings: strict),
        .target(name: "Locking", swiftSettings: strict),
        .target(name: "Postgres", dependencies: ["Locking", "CLibpq", "Logging"], swiftSettings: strict),
        .target(name: "CryptoCore", dependencies: ["COpenSSL"], swiftSettings: strict),
        .target(name: "HTTPServer", dependencies: ["Locking", "CMicroHTTPD", "Logging"], swiftSettings: strict),
        // The one HTTP/1.1 client of our own (POSTs to a server on this host; sockets, poll(2)).
        .target(name: "LoopbackHTTP", dependencies: ["Locking"], swiftSettings: strict),

        // Building blocks.
        .target(name: "JSON", swiftSettings: strict),
        .target(name: "JOSE", dependencies: ["CryptoCore", "JSON"], swiftSettings: strict),
        .target(name: "LocalPostgres", dependencies: ["Locking", "Logging"], swiftSettings: strict),
        .target(name: "SiwaCore", dependencies: ["Locking", "Logging", "JSON"], swiftSettings: strict),
        // sql/ embedded, and the migrator that applies it (the only building block over libpq).
        .target(name: "Migrations", dependencies: ["Logging", "Postgres"], swiftSettings: strict),
        .target(name: "AppleClient", dependencies: ["Locking", "JOSE", "CryptoCore", "Logging", "SiwaCore", "JSON"], swiftSettings: strict),
        .target(name: "JobQueue", dependencies: ["Postgres", "Logging"], swiftSettings: strict),

        // Application logic.
        .target(name: "ReceiverCore",
                dependencies: ["Locking", "SiwaCore", "Postgres", "JOSE", "CryptoCore", "HTTPServer", "Logging", "AppleClient", "JSON"],
                swiftSettings: strict),
        .target(name: "WorkerCore",
                dependencies: ["Locking", "SiwaCore", "Postgres", "JOSE", "CryptoCore", "HTTPServer", "JobQueue",
                               "Logging", "AppleClient", "JSON", "LoopbackHTTP"],
                swiftSettings: strict),
        .target(name: "FakeApple", dependencies: ["Locking", "JOSE", "CryptoCore", "HTTPServer", "Logging", "SiwaCore", "AppleClient"],
                exclude: ["README.md"], swiftSettings: strict),

        // Executables: load configuration, run.
        // Every dependency list here is exact: each module a target's files import, and no other
        // (`--explicit-target-dependency-import-check error` enforces the first half only; see
        // deploy/check/package-deps.sh for the second).
        .executableTarget(name: "siwa-receiver", dependencies: ["ReceiverCore", "SiwaCore", "Logging"],
                          swiftSettings: strict),
        .executableTarget(name: "siwa-worker", dependencies: ["WorkerCore", "SiwaCore", "Postgres", "Logging"],
                          swiftSettings: strict),
        .executableTarget(name: "siwa",
                          dependencies: ["Locking", "SiwaCore", "Migrations", "Postgres", "LocalPostgres", "FakeApple", "JobQueue",
                                         "CryptoCore", "Logging", "WorkerCore", "AppleClient", "HTTPServer", "LoopbackHTTP"],
                          swiftSettings: strict),

        // The receiver's decoding path as a libFuzzer target: deploy/fuzz/run.sh builds it with
        // -sanitize=fuzzer,address; a plain build keeps it compiling (replay / make-corpus modes).
        .executableTarget(name: "SiwaFuzz", dependencies: ["ReceiverCore", "AppleClient", "CryptoCore", "JOSE", "Logging"],
                          path: "Fuzz/SiwaFuzz", exclude: ["Fixtures"], swiftSettings: strict),

        // Unit tests: no network, no database.
        .testTarget(name: "SiwaCoreTests", dependencies: ["SiwaCore"], swiftSettings: strict),
        .testTarget(name: "MigrationsTests", dependencies: ["Migrations"], swiftSettings: strict),
        .testTarget(name: "CryptoCoreTests", dependencies: ["CryptoCore"], swiftSettings: strict),
        .testTarget(name: "JSONTests", dependencies: ["JSON"], swiftSettings: strict),
        .testTarget(name: "JOSETests", dependencies: ["JOSE", "CryptoCore", "JSON"], swiftSettings: strict),
        .testTarget(name: "PostgresTests", dependencies: ["Postgres"], swiftSettings: strict),
        .testTarget(name: "HTTPServerTests", dependencies: ["HTTPServer"], swiftSettings: strict),
        .testTarget(name: "LoopbackHTTPTests", dependencies: ["LoopbackHTTP", "ScriptedHTTPServer"], swiftSettings: strict),
        .testTarget(name: "ReceiverCoreTests",
                    dependencies: ["ReceiverCore", "SiwaCore", "JOSE", "CryptoCore", "AppleClient", "HTTPServer", "Logging"],
                    swiftSettings: strict),
        .testTarget(name: "JobQueueTests", dependencies: ["JobQueue"], swiftSettings: strict),
        .testTarget(name: "AppleClientTests", dependencies: ["AppleClient", "JOSE", "CryptoCore"], swiftSettings: strict),
        .testTarget(name: "WorkerCoreTests", dependencies: ["WorkerCore", "JobQueue", "SiwaCore", "Postgres", "ScriptedHTTPServer"],
                    swiftSettings: strict),
        // A TCP server that answers byte for byte as a test scripts it (for the HTTP clients' tests).
        .target(name: "ScriptedHTTPServer", path: "Tests/ScriptedHTTPServer", swiftSettings: strict),

        // Real PostgreSQL (started by the test support), real processes over HTTP.
        .testTarget(name: "IntegrationTests",
                    dependencies: ["Postgres", "LocalPostgres", "Locking", "SiwaCore", "Migrations", "JOSE", "CryptoCore", "FakeApple",
                                   "JobQueue", "Logging", "HTTPServer", "AppleClient", "WorkerCore"],
                    swiftSettings: strict),
    ]
)
