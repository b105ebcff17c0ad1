-- The account lifecycle as one state machine (issue 10): the schema it needs. The transitions
-- themselves are functions (sql/functions/accounts.sql, sql/functions/notifications.sql).

-- Tokens a deletion must revoke besides the current one: a token replaced by a relink (Apple keeps
-- it valid), or obtained by an exchange that finished while a deletion was pending or after it.
ALTER TABLE siwa.accounts ADD COLUMN retired_tokens_enc bytea[] NOT NULL DEFAULT '{}';

-- SIWA_APP_GROUPS, written by the worker at start: client IDs that share users. A notification
-- for any member applies to the accounts of every member.
CREATE TABLE siwa.app_groups (
    client_id text PRIMARY KEY,
    group_id  text NOT NULL
);
CREATE INDEX app_groups_group ON siwa.app_groups (group_id, client_id);

-- Retention prunes the app's change feed by age.
CREATE INDEX account_changes_created ON siwa.account_changes (created_at);

-- Finished exchange jobs keep no authorization code (discarded and cancelled ones did).
UPDATE siwa.jobs SET args = args - 'code'
 WHERE kind = 'exchange' AND state IN ('completed', 'discarded', 'cancelled') AND args ? 'code';

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_worker') THEN
        EXECUTE 'GRANT SELECT, INSERT, UPDATE, DELETE ON siwa.app_groups TO siwa_worker';
    END IF;
END
$$;

-- What siwa.account(client_id, sub) returns to the app: the account without its tokens.
CREATE TYPE siwa.account_view AS (
    client_id           text,
    sub                 text,
    app_user_id         text,
    status              text,
    email               text,
    is_private_email    boolean,
    email_forwarding    text,
    sessions_revoked_at timestamptz,
    linked_at           timestamptz,
    updated_at          timestamptz,
    has_refresh_token   boolean
);
