-- Webhooks to the app (CONTRACT.md, "Webhooks to the app"): every account change is delivered to
-- SIWA_WEBHOOK_URL by the workers, as a `webhook` job of the queue, in order per account.
--
-- Queueing is decided here, by a statement trigger on siwa.account_changes, so every code path
-- that records a change (effects, app functions, operator commands) queues its delivery in the
-- same transaction: a committed change always has its job, a rolled-back one never.
--
-- No endpoint, no jobs: deliveries are queued only while siwa.webhook_endpoint has its row, which
-- a worker started with SIWA_WEBHOOK_URL writes (and `siwa webhooks disable` removes). A database
-- whose workers have no URL never piles up jobs nobody delivers; from the moment one registers,
-- no change is left out.

-- 1. A job kind of its own. The CHECK of 001 lists the kinds; other migrations may have added
-- theirs, so 'webhook' is added to whatever the constraint allows now rather than restating it.
DO $$
DECLARE
    definition text;
BEGIN
    SELECT pg_catalog.pg_get_constraintdef(c.oid) INTO definition
      FROM pg_catalog.pg_constraint c
     WHERE c.conrelid = 'siwa.jobs'::regclass AND c.conname = 'jobs_kind_check';
    IF definition IS NULL OR position('''webhook''' IN definition) > 0 THEN
        RETURN;
    END IF;
    IF position('ARRAY[' IN definition) = 0 THEN
        RAISE EXCEPTION 'siwa 007: unexpected jobs_kind_check definition: %', definition;
    END IF;
    ALTER TABLE siwa.jobs DROP CONSTRAINT jobs_kind_check;
    EXECUTE 'ALTER TABLE siwa.jobs ADD CONSTRAINT jobs_kind_check '
         || replace(definition, 'ARRAY[', 'ARRAY[''webhook''::text, ');
END
$$;

-- 2. Claim paths. Deliveries have a claim of their own (the account's oldest undelivered change
-- only), so the Apple-calling kinds' claim index leaves them out: a delivery backlog never makes
-- that claim scan past it.
DROP INDEX IF EXISTS siwa.jobs_claim_calls;
CREATE INDEX jobs_claim_calls ON siwa.jobs (priority, run_at, id)
    WHERE state = 'available' AND kind NOT IN ('notification', 'webhook');
CREATE INDEX jobs_claim_webhook ON siwa.jobs (run_at, id)
    WHERE state = 'available' AND kind = 'webhook';
-- An account's undelivered changes in order: the claim's ordering check and the status figures.
-- `discarded` stays in: a discarded delivery still holds back the account's later changes.
CREATE INDEX jobs_webhook_undelivered ON siwa.jobs (client_id, sub, id)
    WHERE kind = 'webhook' AND state IN ('available', 'running', 'discarded');

-- 3. The registered endpoint: one row or none. `endpoint` is the URL without its query, for
-- `siwa status` (a query string may carry a token); the secret is never stored.
CREATE TABLE siwa.webhook_endpoint (
    singleton     boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    endpoint      text        NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now(),
    -- A worker holding the URL refreshes this while it runs: status shows when one last did.
    seen_at       timestamptz NOT NULL DEFAULT now()
);

-- 4. Queueing: one delivery job per change, in change order, while an endpoint is registered.
-- The function's body is in sql/functions/webhooks.sql; this stub lets the trigger exist first.
CREATE FUNCTION siwa.queue_webhook_deliveries() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RETURN NULL;
END
$$;
CREATE TRIGGER account_changes_queue_webhooks
    AFTER INSERT ON siwa.account_changes
    REFERENCING NEW TABLE AS new_changes
    FOR EACH STATEMENT EXECUTE FUNCTION siwa.queue_webhook_deliveries();

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_worker') THEN
        EXECUTE 'GRANT SELECT, INSERT, UPDATE, DELETE ON siwa.webhook_endpoint TO siwa_worker';
    END IF;
END
$$;
