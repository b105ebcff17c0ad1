-- Team transfer (TN3159): when the app moves to another developer team, every user's `sub` changes.
-- The sending team obtains a transfer identifier per user and hands `transfer_sub,app_user_id`
-- lines to the recipient, which exchanges each for the user's new `sub`. Functions:
-- sql/functions/transfer.sql.

-- Sending side: the identifier obtained for the account, stored on it so an interrupted export
-- asks Apple only for the accounts still missing one (per target team: a new target asks again).
ALTER TABLE siwa.accounts
    ADD COLUMN transfer_sub         text,
    ADD COLUMN transfer_target_team text,
    ADD COLUMN transfer_sub_at      timestamptz;
-- A recipient that is the same database (the back end moves with the app) finds the account to
-- re-key by its transfer identifier.
CREATE INDEX accounts_transfer_sub ON siwa.accounts (client_id, transfer_sub) WHERE transfer_sub IS NOT NULL;

-- Recipient side: one row per line of the sending team's export. `pending` until exchanged for the
-- new `sub` by `siwa accounts transfer import` or claimed by a sign-in whose identity token carries
-- the `transfer_sub` (whichever comes first); `done` then, or `skipped` when the account it would
-- become is being deleted.
CREATE TABLE siwa.transfer_imports (
    client_id    text        NOT NULL,
    transfer_sub text        NOT NULL,
    app_user_id  text        NOT NULL,
    state        text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'done', 'skipped')),
    sub          text,                    -- the user's sub under the new team, once known
    completed_by text CHECK (completed_by IN ('import', 'sign_in')),
    attempts     integer     NOT NULL DEFAULT 0,
    last_error   text,                    -- Apple's classified answer (no identifiers, no secrets)
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    completed_at timestamptz,
    PRIMARY KEY (client_id, transfer_sub)
);
CREATE INDEX transfer_imports_pending ON siwa.transfer_imports (client_id, transfer_sub) WHERE state = 'pending';

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_worker') THEN
        -- The worker serves sign-in (app API); siwa.claim_transfer runs as its owner, this is for
        -- operators who run `siwa accounts transfer` as a worker login.
        EXECUTE 'GRANT SELECT, INSERT, UPDATE ON siwa.transfer_imports TO siwa_worker';
    END IF;
END
$$;
