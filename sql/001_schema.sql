-- Tables of the outside contract (siwa.notifications, siwa.accounts, siwa.account_changes)
-- and the job queue that connects the receiver to the workers.

CREATE SCHEMA IF NOT EXISTS siwa;

-- One row per verified notification. The receiver writes it; the worker records the outcome.
CREATE TABLE siwa.notifications (
    jti              text PRIMARY KEY,
    client_id        text        NOT NULL,
    sub              text        NOT NULL,
    event_type       text        NOT NULL,
    event_time       timestamptz NOT NULL,
    email            text,
    is_private_email boolean,
    claims           jsonb       NOT NULL,
    jws              text,                 -- the signed token as received, for audit and replay
    received_at      timestamptz NOT NULL DEFAULT now(),
    processed_at     timestamptz,
    outcome          text
);
CREATE INDEX notifications_account ON siwa.notifications (client_id, sub);
-- Retention deletes processed rows by age; keep that a range scan.
CREATE INDEX notifications_processed ON siwa.notifications (processed_at) WHERE processed_at IS NOT NULL;

-- One row per Sign in with Apple link.
CREATE TABLE siwa.accounts (
    client_id           text NOT NULL,
    sub                 text NOT NULL,
    app_user_id         text,
    status              text NOT NULL
        CHECK (status IN ('active', 'consent_revoked', 'apple_account_deleted', 'pending_deletion', 'deleted')),
    email               text,
    is_private_email    boolean,
    email_forwarding    text CHECK (email_forwarding IN ('enabled', 'disabled')),
    refresh_token_enc   bytea,
    sessions_revoked_at timestamptz,
    linked_at           timestamptz,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    -- Order tracking (not part of the contract): the event_time of the last applied email
    -- event, so a late email-enabled/disabled never overwrites a newer one.
    last_email_event_at timestamptz,
    -- When the refresh token was last checked with Apple (reconciliation, at most daily).
    token_checked_at    timestamptz,
    PRIMARY KEY (client_id, sub)
);
CREATE INDEX accounts_app_user ON siwa.accounts (app_user_id) WHERE app_user_id IS NOT NULL;

-- Every applied effect, for the app to act on (end sessions, purge data). NOTIFY
-- siwa_account_changes carries the id so a listener reads the row.
CREATE TABLE siwa.account_changes (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    client_id        text        NOT NULL,
    sub              text        NOT NULL,
    app_user_id      text,
    change           text        NOT NULL,
    status           text,                 -- the account status after the change
    reason           text,                 -- why, for failures (no secrets, no token content)
    notification_jti text,
    job_id           bigint,
    created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX account_changes_account ON siwa.account_changes (client_id, sub, id);

-- The queue. A job is `available` (run_at may be in the future: a scheduled retry),
-- `running` (leased by a worker until locked_until), or final: `completed`, `discarded`
-- (out of attempts, kept for an operator to retry) or `cancelled`.
CREATE TABLE siwa.jobs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind             text        NOT NULL CHECK (kind IN ('notification', 'exchange', 'revoke', 'reconcile')),
    state            text        NOT NULL DEFAULT 'available'
        CHECK (state IN ('available', 'running', 'completed', 'discarded', 'cancelled')),
    priority         smallint    NOT NULL DEFAULT 2,  -- lower runs first: exchanges 0, revokes 1
    client_id        text        NOT NULL,
    sub              text        NOT NULL,
    notification_jti text,
    args             jsonb       NOT NULL DEFAULT '{}',
    attempt          integer     NOT NULL DEFAULT 0,  -- also the lease's fencing token
    max_attempts     integer     NOT NULL DEFAULT 25,
    run_at           timestamptz NOT NULL DEFAULT now(),
    locked_by        text,
    locked_until     timestamptz,
    errors           jsonb       NOT NULL DEFAULT '[]',
    outcome          text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    finalized_at     timestamptz
);
-- The claim walks this index in order and stops at LIMIT: it stays an index scan whatever
-- the statistics say, because it is the only way to get rows in this order cheaply.
CREATE INDEX jobs_claim ON siwa.jobs (priority, run_at, id) WHERE state = 'available';
CREATE INDEX jobs_lease ON siwa.jobs (locked_until) WHERE state = 'running';
CREATE INDEX jobs_account ON siwa.jobs (client_id, sub, kind);
CREATE INDEX jobs_finalized ON siwa.jobs (finalized_at) WHERE finalized_at IS NOT NULL;
CREATE INDEX jobs_notification ON siwa.jobs (notification_jti) WHERE notification_jti IS NOT NULL;

-- Client IDs whose Apple calls are paused after invalid_client / unauthorized_client.
CREATE TABLE siwa.paused_clients (
    client_id     text PRIMARY KEY,
    reason        text        NOT NULL,
    paused_at     timestamptz NOT NULL DEFAULT now(),
    next_probe_at timestamptz NOT NULL DEFAULT now()
);

-- Counters the receiver cannot keep in the database without a write per rejected request:
-- rejected notifications are counted per minute and reason for `siwa status`.
CREATE TABLE siwa.rejections (
    minute timestamptz NOT NULL,
    reason text        NOT NULL,
    count  bigint      NOT NULL,
    PRIMARY KEY (minute, reason)
);
