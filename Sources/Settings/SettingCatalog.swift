/// Every setting any program reads, in the order the documents list them. Adding a setting: one
/// entry here, then the line that reads it; `swift run siwa config-reference --markdown` / `--env`
/// print the README table and the systemd example to paste (`SettingDocumentsTests` says when
/// they are stale).
package enum SettingCatalog {
    package static let all: [Setting] = common + receiver + worker + appAPI + webhooks + dev

    package static func named(_ name: String) -> Setting? { all.first { $0.name == name } }

    /// The names `reader` accepts (as variables and as flags), in catalog order.
    package static func names(readBy reader: Setting.Reader) -> [String] {
        all.filter { $0.isRead(by: reader) }.map(\.name)
    }

    static let apple: Set<Setting.Reader> = [.worker, .dev, .accounts]

    static let common: [Setting] = [
        Setting(
            "DATABASE_URL", [], note: "required (`siwa dev` makes one)", secret: true,
            deploy: "Each unit sets it to its own login's credential.", "libpq URI or conninfo"),
        Setting("SIWA_LOG_LEVEL", [], default: "info", "`debug`, `info`, `warn`, `error`; one JSON object a line on stderr"),
        Setting(
            "SIWA_CLIENT_IDS", [.receiver, .worker, .dev, .accounts], note: "required (`siwa dev`: `com.example.app`)",
            example: "com.example.app,com.example.app.web", "comma-separated accepted `aud` values (bundle IDs, Services IDs)"),
        Setting(
            "SIWA_CA", [.receiver, .worker, .dev, .accounts, .webhooks, .simulate], note: "unset: the system's trust store only",
            "given as `SIWA_CA_FILE`: PEM file of further CA certificates trusted for `https://` calls (a private CA, a TLS-inspecting egress proxy), in addition to the system's; `HTTPS_PROXY`/`NO_PROXY` are honoured too"),
        Setting(
            "SIWA_APPLE_BASE_URL", [.receiver, .worker, .dev, .accounts, .simulate], default: "https://appleid.apple.com",
            "keys at `{base}/auth/keys`, exchange `{base}/auth/token`, revoke `{base}/auth/revoke`; `iss` stays `https://appleid.apple.com`; `http://` only to a loopback host"),
    ]

    static let receiver: [Setting] = [
        Setting(
            "SIWA_LISTEN", [.receiver, .dev], default: "0.0.0.0:8080", note: "(`siwa dev`: `127.0.0.1:8080`, or a free port if busy)",
            example: "127.0.0.1:8080", deploy: "Behind nginx on this host, listen on loopback only.", "host:port"),
        Setting("SIWA_NOTIFICATION_PATH", [.receiver, .dev], default: "/apple/notifications", "the POST path (the endpoint registered with Apple)"),
        Setting(
            "SIWA_RECEIVER_COMMIT_TIMEOUT", [.receiver], default: "5s",
            "longest a notification waits on the database, queue and commit, before 503 `database_timeout`; also the receiver sessions' `statement_timeout` and `lock_timeout`"),
        Setting(
            "SIWA_RECEIVER_DB_CONNECTIONS", [.receiver], default: "1",
            "group-commit connections (each commit carries every notification queued meanwhile; one measured fastest on 2 cores, more help only when a commit's round trip is the limit)"),
        Setting(
            "SIWA_RECEIVER_MAX_PENDING", [.receiver], default: "4096",
            "verified notifications waiting for a commit beyond this are refused with 503 `overloaded`"),
        Setting("SIWA_RECEIVER_THREADS", [.receiver], note: "cores", "HTTP threads"),
        Setting(
            "SIWA_RECEIVER_CONNECTION_LIMIT", [.receiver], default: "2048",
            "open connections at most (the systemd unit's `LimitNOFILE=8192` stays above it)"),
        Setting(
            "SIWA_RECEIVER_PER_ADDRESS_LIMIT", [.receiver], default: "64", note: "; none when `SIWA_LISTEN` is a loopback address",
            "open connections from one address at most; listening on loopback means a proxy on this host, whose address every connection has, so the per-client limit is the proxy's there (`deploy/nginx/siwa.conf`: `limit_conn`)"),
        Setting("SIWA_RECEIVER_CONNECTION_TIMEOUT", [.receiver], default: "10", "seconds an idle connection is kept"),
        Setting(
            "SIWA_RECEIVER_REQUEST_TIMEOUT", [.receiver], default: "30s",
            "a connection must deliver a whole request (headers and body) within this of opening or of its last answer, however steadily it trickles bytes; then it is closed"),
        Setting(
            "SIWA_JWKS_REFETCH_INTERVAL", [.receiver], default: "10",
            "least seconds between two fetches of Apple's keys caused by unknown `kid`s"),
        Setting(
            "SIWA_PUBLIC_URL", [.receiver], note: "unset: web sign-in not served", example: "https://auth.example.com",
            "public base URL of the receiver behind its TLS proxy (`https://`; `http://` only to a loopback address, where port 0 means the port the receiver bound; no path); Apple's redirect URI is `{SIWA_PUBLIC_URL}/apple/sign-in/callback` (register it for the Services ID)"),
        Setting(
            "SIWA_WEB_RETURN_URLS", [.receiver], note: "required with `SIWA_PUBLIC_URL`",
            example: "https://app.example.com/signed-in,com.example.app:/signed-in",
            "comma-separated URLs a web sign-in may return to, compared exactly; `https://`, `http://` only to a loopback address, or an app's own scheme; never `javascript:`, `data:` or `file:`"),
        Setting(
            "SIWA_WEB_SIGN_IN_MAX_PENDING", [.receiver], default: "10000",
            "unspent web sign-in states (and, apart, tickets) kept at once; past it `GET /apple/sign-in` answers 429 `too_many_sign_ins`"),
    ]

    static let worker: [Setting] = [
        Setting(
            "SIWA_TEAM_ID", apple, note: "required unless `SIWA_APPLE_CALLS=disabled`", example: "ABCDE12345",
            "client_secret signing: the Team ID"),
        Setting(
            "SIWA_KEY_ID", apple, note: "required unless `SIWA_APPLE_CALLS=disabled`", example: "KEY1234567",
            "client_secret signing: the key ID"),
        Setting(
            "SIWA_PRIVATE_KEY_FILE", apple, note: "required unless `SIWA_APPLE_CALLS=disabled`",
            deploy: "Set by the unit to the credential %d/apple-key.p8; do not set it here.",
            "client_secret signing: path of the `.p8` (PEM PKCS#8, P-256)"),
        Setting(
            "SIWA_TOKEN_KEYS", [.worker, .dev, .accounts], note: "required unless `SIWA_APPLE_CALLS=disabled`", secret: true,
            deploy: "Make one: printf 'k1:%s\\n' \"$(openssl rand -base64 32)\"",
            "`id:base64(32 bytes)` comma-separated; the first encrypts, all decrypt (rotation)"),
        Setting(
            "SIWA_APPLE_CALLS", [.worker, .dev], default: "enabled",
            "`disabled`: no calls to Apple (no exchange, no revoke): such a worker claims no exchange, revoke or reconcile job, so they wait for a worker with credentials; then the Apple credentials are not required"),
        Setting("SIWA_WORKER_CONCURRENCY", [.worker, .dev], default: "4", "jobs in flight per process"),
        Setting(
            "SIWA_RETENTION_DAYS", [.worker, .dev], default: "30",
            "days a processed notification is kept; also `siwa.account_changes` rows, and the personal data (email, `jws`) of a notification whose job was discarded"),
        Setting(
            "SIWA_OPS_LISTEN", [.worker, .dev], default: "127.0.0.1:9090",
            deploy: "The unit siwa-worker@N sets 127.0.0.1:909N per instance; do not set it here.",
            "worker's `/healthz`, `/readyz`, `/metrics`"),
        Setting(
            "SIWA_RETRY_BASE", [.worker, .accounts], default: "1s",
            "backoff after a failed job: uniform in [0, base × 2^(failures−1)], capped at 1 h; Apple's `Retry-After` is a floor. A duration: `500ms`, `1s`, `2m`"),
        Setting(
            "SIWA_PAUSE_PROBE_INTERVAL", [.worker], default: "5m",
            "a client ID Apple refused (`invalid_client`) stays paused this long before one job probes it again"),
        Setting(
            "SIWA_RECONCILE", [.worker], default: "off",
            "`daily`: check each active account's refresh token with Apple at most once a day; `invalid_grant` is treated as the `consent-revoked` a lost notification never brought"),
        Setting(
            "SIWA_LISTEN_NOTIFY", [.worker], default: "true",
            "`false`: poll only (PgBouncer in transaction pooling mode passes no NOTIFY)"),
        Setting("SIWA_POLL_INTERVAL", [.worker], default: "1s", "longest wait between claims when no NOTIFY arrives"),
        Setting(
            "SIWA_JOB_LEASE", [.worker], default: "60s",
            "how long a claimed job (an Apple call or a webhook delivery) is leased; heartbeats extend it, a dead worker's jobs are rescued after it; a job whose worker died running it three times is discarded with the error `process_died` (kept; `siwa jobs retry ID` runs it again)"),
        Setting(
            "SIWA_SHUTDOWN_GRACE", [.worker], default: "30s",
            "on SIGTERM/SIGINT: time in-flight jobs get to finish before they are handed back"),
        Setting(
            "SIWA_NOTIFICATION_BATCH", [.worker], default: "250",
            "most notification jobs applied per transaction; a batch that finds accounts held by another transaction leaves their jobs queued (`siwa_worker_notifications_deferred_total`) and the next limit halves, down to a sixteenth, then grows back by a sixteenth per batch that runs full without that"),
        Setting(
            "SIWA_NOTIFICATION_CONNECTIONS", [.worker], default: "2",
            "notification batches in flight per process, each on its own connection (one leaves PostgreSQL idle while its commit waits for the disk)"),
        Setting(
            "SIWA_COMPLETED_JOB_RETENTION", [.worker], default: "7d",
            "completed and cancelled jobs are pruned after this (discarded jobs are kept)"),
        Setting("SIWA_WORKER_ID", [.worker], note: "`host:pid`", "`locked_by` on claimed jobs"),
        Setting(
            "SIWA_APP_GROUPS", [.worker], note: "unset: each client ID alone",
            "client IDs that share users: `;`-separated groups of `,`-separated IDs ([app groups](../sql/README.md))"),
        Setting(
            "SIWA_WORKER_STATEMENT_TIMEOUT", [.worker], default: "60s",
            "every worker session's `statement_timeout` (and `lock_timeout` at half of it): a held lock or a stalled server fails the claim, retried, instead of hanging the worker"),
    ]

    static let appAPI: [Setting] = [
        Setting(
            "SIWA_APP_API_LISTEN", [.worker, .dev], note: "unset: not served (`siwa dev`: `127.0.0.1:8081`, or a free port)",
            deploy: "Each worker instance needs its own port: set it in /etc/siwa/siwa-worker-N.env.",
            "host:port of the app API (internal network only; needs the Apple credentials)"),
        Setting(
            "SIWA_APP_API_TOKENS", [.worker, .dev, .simulate], note: "required when served (`siwa dev` makes one)", secret: true,
            deploy: "Make one: openssl rand -hex 32",
            "comma-separated bearer tokens of ≥ 32 characters"),
        Setting("SIWA_NONCE_TTL", [.worker], default: "5m", "lifetime of a sign-in nonce (10 s to 1 h)"),
        Setting(
            "SIWA_NONCE_MAX_UNSPENT", [.worker], default: "100000",
            "unspent nonces kept at once; past it `POST /v1/nonces` answers 429 `too_many_nonces` with `Retry-After`"),
        Setting(
            "SIWA_APP_API_REQUEST_TIMEOUT", [.worker], default: "10s",
            "a request's headers and body must arrive within this (counted from when its connection opened or answered the last request, so an idle kept-alive connection is closed sooner), else the connection is closed; 1 s to 5 min"),
        Setting(
            "SIWA_APP_API_CONNECTIONS_PER_ADDRESS", [.worker], default: "64",
            "open connections one client address may hold; more are refused at once (counted in `siwa_app_api_connections_refused_total`)"),
        Setting(
            "SIWA_CONSOLE_TOKENS", [.console], note: "unset: loopback only", secret: true,
            "comma-separated login tokens of ≥ 32 characters; required to `--listen` on a non-loopback address"),
    ]

    static let webhooks: [Setting] = [
        Setting(
            "SIWA_WEBHOOK_URL", [.worker, .webhooks], note: "unset: no webhooks",
            "`https://` URL (`http://` only to a loopback address) that receives every account change ([Webhooks to the app](../README.md#webhooks-to-the-app)); no credentials in it"),
        Setting(
            "SIWA_WEBHOOK_SECRET", [.worker, .webhooks], note: "required with the URL", secret: true,
            "`whsec_` + base64 of 24–64 random bytes: `echo \"whsec_$(head -c32 /dev/urandom \\| base64)\"`"),
        Setting(
            "SIWA_WEBHOOK_CONCURRENCY", [.worker, .webhooks], default: "32",
            "deliveries in flight per worker process (each for another account)"),
    ]

    static let dev: [Setting] = [
        Setting("SIWA_DEV_EXIT_AFTER", [.dev], "stop after this many seconds (scripts)"),
        Setting("SIWA_DEV_READY_TIMEOUT", [.dev], default: "60", "seconds to wait for the receiver's `/readyz`"),
        Setting(
            "SIWA_DEV_FAKE_APPLE_TLS", [.dev], default: "on",
            "`off`: the fake Apple serves plain `http://`; on, it serves `https://` with a certificate from a throwaway CA made for the run (in its private temporary folder, removed on exit), which the receiver and worker trust through `SIWA_CA_FILE`"),
        Setting(
            "SIWA_RECEIVER_URL", [.simulate], default: "http://127.0.0.1:8080/apple/notifications",
            note: "(`siwa dev` prints it)", "the notification endpoint `siwa simulate` posts to"),
        Setting(
            "SIWA_APP_API_URL", [.simulate], default: "http://127.0.0.1:8081", note: "(`siwa dev` prints it)",
            "the app API `siwa simulate sign-in` uses"),
    ]
}
