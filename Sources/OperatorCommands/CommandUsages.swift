import FakeApple
import JobQueue
import TeamTransfer
import Settings

// Each command's usage: its flags with meaning and default, and the settings it reads. Kept beside
// one another so the help reads alike everywhere.

extension MigrateCommand {
    static let usage = CommandUsage(
        synopsis: ["siwa migrate"],
        about: "Applies the SQL migrations not yet recorded in siwa.schema_migrations, each in a transaction, then every "
            + "sql/functions file whose text changed, under an advisory lock: safe twice or from two processes at once.",
        reader: .databaseCommands)
}

extension StatusCommand {
    static let usage = CommandUsage(
        synopsis: ["siwa status [--json]"],
        about: "The queue, pending deletions, paused client IDs and the last hour's notifications. Exit 1 with one line "
            + "when the database is unreachable.",
        options: [.init("json", "one JSON object instead of the text report")],
        reader: .databaseCommands)
}

extension JobsCommand {
    static let usage = CommandUsage(
        synopsis: [
            "siwa jobs list [--state S] [--kind K] [--sub SUB] [--limit N] [--json]",
            "siwa jobs retry ID | --sub SUB [--kind K]",
            "siwa jobs cancel ID | --sub SUB [--kind K] [--force]",
        ],
        about: "Looks at the queue and acts on one job or on one user's jobs (--kind narrows to one kind: --sub SUB "
            + "--kind revoke leaves the user's webhook deliveries alone). retry: discarded jobs (and available ones "
            + "waiting out a backoff) run again now, their errors kept. Cancelled jobs are not retried: they were "
            + "stopped on purpose, and a cancelled exchange no longer holds its code; do the action again instead. "
            + "cancel: available and running jobs end as cancelled. Each job acted on is printed with its kind.",
        options: [
            .init("state", "S", "list: only jobs in this state (\(JobAdministration.states.joined(separator: ", ")))", default: "all"),
            .init("kind", "K", "only jobs of this kind (\(JobAdministration.kinds.joined(separator: ", ")))", default: "all kinds"),
            .init("sub", "SUB", "only this user's jobs (every client ID)"),
            .init("limit", "N", "list: at most N jobs, newest first", default: "50"),
            .init("json", nil, "list: one JSON array instead of the table"),
            .init("force", nil, "cancel: also the revoke of a pending deletion (the account then waits for a new "
                + "siwa.request_deletion call)"),
        ],
        reader: .databaseCommands, arguments: .actions(["list": 1, "retry": 2, "cancel": 2]))
}

extension DevCommand {
    static let usage = CommandUsage(
        synopsis: ["siwa dev [--once] [--no-fake-apple] [--no-worker]"],
        about: "The whole stack on this machine: a throwaway PostgreSQL (unless DATABASE_URL is set) with a generated "
            + "password, the fake Apple (unless SIWA_APPLE_BASE_URL is set), migrations, siwa-receiver and one "
            + "siwa-worker. Prints the lines to paste in another terminal and one line per notification, sign-in and "
            + "account change. Ctrl-C, SIGTERM, SIGHUP or a closed output pipe stop everything and delete the "
            + "throwaway database; so does a watchdog within seconds if siwa dev itself is killed. Temporary folders "
            + "are made under $TMPDIR (default /tmp).",
        options: [
            .init("once", nil, "stop as soon as everything is ready (smoke tests)"),
            .init("no-fake-apple", nil, "do not start the fake Apple (then the worker calls the real one, or none)"),
            .init("no-worker", nil, "start no worker: jobs wait in siwa.jobs"),
        ],
        reader: .dev,
        defaultsHere: Dictionary(uniqueKeysWithValues: ["SIWA_TEAM_ID", "SIWA_KEY_ID", "SIWA_PRIVATE_KEY_FILE", "SIWA_TOKEN_KEYS"].map {
            ($0, "not needed: siwa dev makes throwaway ones the fake Apple accepts; set all four to use your own")
        }).merging([
            "DATABASE_URL": "unset: siwa dev starts a throwaway PostgreSQL",
            "SIWA_CLIENT_IDS": "com.example.app",
        ]) { $1 })
}

extension FakeAppleCommand {
    static let usage = CommandUsage(
        synopsis: [
            "siwa fake-apple [--listen 127.0.0.1:9443] [--verify-key-file KEY.p8] [--team-id T]",
            "                [--recipient-team-id T2 [--recipient-verify-key-file KEY2.p8]] [--signing-key-file rsa.pem]",
            "                [--tls-cert-file CERT.pem --tls-key-file KEY.pem]",
        ],
        about: "A local stand-in for Apple's /auth/keys, /auth/token, /auth/revoke and /auth/usermigrationinfo, with "
            + "test endpoints of its own (below). Test only; siwa dev starts one (over https, with a throwaway CA). "
            + "Prints `fake-apple listening on http://HOST:PORT` (https with a certificate).",
        options: [
            .init("listen", "HOST:PORT", "where to listen (port 0: one the system picks)", default: "127.0.0.1:9443"),
            .init("verify-key-file", "KEY", "P-256 public key or .p8 every client_secret must be signed with", default: "signatures not checked"),
            .init("team-id", "T", "the team every client_secret must name", default: "any"),
            .init("recipient-team-id", "T2", "a second team, to rehearse a team transfer"),
            .init("recipient-verify-key-file", "KEY2", "the second team's key"),
            .init("signing-key-file", "PEM", "the RSA key that signs identity tokens and notifications, kept across "
                + "restarts (made when missing)", default: "a fresh key each start"),
            .init("tls-cert-file", "CERT.pem", "serve https:// with this certificate (PEM; TLS 1.2 or later)", default: "plain http"),
            .init("tls-key-file", "KEY.pem", "the certificate's private key (PEM)"),
        ],
        extraSettings: ["SIWA_LOG_LEVEL"],
        notes: FakeAppleEndpoints.help)
}

extension SimulateCommand {
    static let usage = CommandUsage(
        synopsis: [
            "siwa simulate TYPE --sub SUB --client-id ID [--email E] [--private-email true|false] [--event-time MS] [--jti J]",
            "              [--receiver-url URL] [--fake-apple-url URL]",
            "siwa simulate TYPE --client-id ID --count N --output FILE [--sub-prefix P]",
            "siwa simulate sign-in --client-id ID --sub SUB [--email E] [--no-code] [--api-url URL] [--fake-apple-url URL]",
            "              [--count N --concurrency C] [--web-url URL --return-to URL]",
        ],
        about: "Signs a notification (TYPE: consent-revoked, account-deleted, email-enabled, email-disabled) with the "
            + "fake Apple's key and posts it to the receiver; exit 0 on 200. `sign-in` runs a whole sign-in against the "
            + "app API: a nonce, the fake Apple's identity token for its hash, POST /v1/sign-in; exit 0 on 200. The URLs "
            + "come from the flags, else from the variables siwa dev prints (SIWA_RECEIVER_URL, SIWA_APPLE_BASE_URL, "
            + "SIWA_APP_API_URL, SIWA_APP_API_TOKENS_FILE). Give the API token through SIWA_APP_API_TOKENS_FILE rather "
            + "than a flag: a command line is visible to every user of the machine.",
        options: [
            .init("sub", "SUB", "the user the notification is about (sign-in: who signs in)"),
            .init("client-id", "ID", "the app (the token's aud)"),
            .init("email", "E", "the email the event or the identity token carries"),
            .init("private-email", "true|false", "is_private_email of an email event"),
            .init("event-time", "MS", "event_time in milliseconds", default: "now"),
            .init("jti", "J", "the token's jti", default: "random"),
            .init("receiver-url", "URL", "where to post", default: "SIWA_RECEIVER_URL, else http://127.0.0.1:8080/apple/notifications"),
            .init("fake-apple-url", "URL", "the fake Apple", default: "SIWA_APPLE_BASE_URL, else http://127.0.0.1:9443"),
            .init("count", "N", "notifications to sign (with --output), or sign-ins to run", default: "1"),
            .init("output", "FILE", "write one request body per line instead of posting (load tests)"),
            .init("sub-prefix", "P", "with --count: sub of the i-th notification is P<i>", default: "sim-"),
            .init("api-url", "URL", "sign-in: the app API", default: "SIWA_APP_API_URL, else http://127.0.0.1:8081"),
            .init("api-token", "T", "sign-in: the bearer token; avoid it, a command line is visible to every local user",
                  default: "the first of SIWA_APP_API_TOKENS, or of the file SIWA_APP_API_TOKENS_FILE names"),
            .init("concurrency", "C", "sign-in with --count: sign-ins at a time", default: "1"),
            .init("no-code", nil, "sign-in: send no authorization code"),
            .init("web-url", "URL", "sign-in: the web flow instead, through the receiver at URL (its SIWA_PUBLIC_URL): "
                  + "/apple/sign-in, the fake Apple's authorize page, the callback, then POST /v1/sign-in with the ticket"),
            .init("return-to", "URL", "sign-in with --web-url: the return URL (one of SIWA_WEB_RETURN_URLS)"),
        ],
        reader: .simulate, unusedSettings: ["DATABASE_URL"], arguments: .upTo(1))
}

extension AccountsCommand {
    static let usage = CommandUsage(
        synopsis: [
            "siwa accounts import < accounts.csv",
            "siwa accounts rotate-keys",
            "siwa accounts transfer export --target-team TEAMID [--client-id ID] [--rate N] [--concurrency N] > file",
            "siwa accounts transfer import [--client-id ID] < file",
        ],
        about: "import: lines client_id,sub,app_user_id,refresh_token become active accounts, tokens encrypted with the "
            + "first SIWA_TOKEN_KEYS key. rotate-keys: re-encrypts every token not sealed with that key (resumable). "
            + "transfer: moves the app's users to another developer team (README, \"Moving an app to another team\").",
        options: [
            .init("target-team", "TEAMID", "transfer export: the recipient team"),
            .init("client-id", "ID", "transfer: the app", default: "the one SIWA_CLIENT_IDS names"),
            .init("rate", "N", "transfer: calls to Apple per second at most", default: "\(MigrationCallSettings().rate)"),
            .init("concurrency", "N", "transfer: calls to Apple at a time", default: "\(MigrationCallSettings().concurrency)"),
        ],
        reader: .accounts, arguments: .actions(["import": 1, "rotate-keys": 1, "transfer": 2]))
}

extension WebhooksCommand {
    static let usage = CommandUsage(
        synopsis: [
            "siwa webhooks test",
            "siwa webhooks disable",
            "siwa webhooks sink [--listen 127.0.0.1:9099] [--quiet] [--tls-cert-file CERT.pem --tls-key-file KEY.pem]",
        ],
        about: "test: sends a signed test event to SIWA_WEBHOOK_URL with SIWA_WEBHOOK_SECRET and prints the answer; exit 0 "
            + "on a 2xx, 1 otherwise. disable: stops queueing deliveries (DATABASE_URL) and cancels the queued ones; a "
            + "worker started with SIWA_WEBHOOK_URL enables them again. sink: a local receiver that checks each "
            + "signature with SIWA_WEBHOOK_SECRET, answers 204 (401 to a signature that does not verify), prints one "
            + "line per delivery; GET /stats gives counts and delays.",
        options: [
            .init("listen", "HOST:PORT", "sink: where to listen", default: "127.0.0.1:9099"),
            .init("quiet", nil, "sink: print no line per delivery"),
            .init("tls-cert-file", "CERT.pem", "sink: serve https:// with this certificate (PEM)", default: "plain http"),
            .init("tls-key-file", "KEY.pem", "sink: the certificate's private key (PEM)"),
        ],
        reader: .webhooks, extraSettings: ["DATABASE_URL", "SIWA_LOG_LEVEL"],
        arguments: .actions(["test": 1, "disable": 1, "sink": 1]))
}

extension ConsoleCommand {
    static let usage = CommandUsage(
        synopsis: ["siwa console [--listen 127.0.0.1:9400]"],
        about: "A web page for the people who run the service: the queue, pending deletions, paused client IDs, webhooks, "
            + "replication, each account's timeline, each job's page (/jobs/ID), every page stamped with when it was read "
            + "and reloading every 30 s unless paused, retry and cancel (POSTs with a per-session anti-forgery token). Reads with a login "
            + "in siwa_worker (DATABASE_URL). Loopback by default; another address needs SIWA_CONSOLE_TOKENS and a login "
            + "page. Prints `console on http://HOST:PORT/`; runs until SIGINT or SIGTERM.",
        options: [.init("listen", "HOST:PORT", "where to listen (port 0: one the system picks)", default: "127.0.0.1:9400")],
        reader: .console, extraSettings: ["DATABASE_URL", "SIWA_LOG_LEVEL"])
}
