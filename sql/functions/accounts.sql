-- The app's side of an account: linking, deletion, and the change feed every effect writes to.
-- Applied after the numbered migrations whenever this file changes (see sql/functions/README.md).

-- Appends to siwa.account_changes and tells listeners. Every applied effect goes through here.
CREATE OR REPLACE FUNCTION siwa.record_change(
    p_client_id text, p_sub text, p_change text, p_reason text, p_jti text, p_job_id bigint
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    account siwa.accounts;
    change_id bigint;
BEGIN
    SELECT * INTO account FROM siwa.accounts WHERE client_id = p_client_id AND sub = p_sub;
    INSERT INTO siwa.account_changes (client_id, sub, app_user_id, change, status, reason, notification_jti, job_id)
    VALUES (p_client_id, p_sub, account.app_user_id, p_change, account.status, p_reason, p_jti, p_job_id)
    RETURNING id INTO change_id;
    PERFORM pg_notify('siwa_account_changes', json_build_object(
        'id', change_id, 'client_id', p_client_id, 'sub', p_sub, 'app_user_id', account.app_user_id,
        'change', p_change, 'status', account.status)::text);
    RETURN change_id;
END
$$;

-- App-facing: queue the exchange of a fresh authorization code (codes live five minutes, single
-- use). Runs first in the queue. The worker removes the code from the row once it is used.
CREATE OR REPLACE FUNCTION siwa.link_account(client_id text, sub text, app_user_id text, authorization_code text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    job_id bigint;
BEGIN
    IF coalesce(client_id, '') = '' OR coalesce(sub, '') = '' OR coalesce(authorization_code, '') = '' THEN
        RAISE EXCEPTION 'siwa.link_account: client_id, sub and authorization_code are required'
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO siwa.jobs (kind, priority, client_id, sub, args, max_attempts, run_at)
    VALUES ('exchange', 0, link_account.client_id, link_account.sub,
            jsonb_build_object('app_user_id', link_account.app_user_id, 'code', authorization_code),
            8, now())
    RETURNING id INTO job_id;
    RETURN job_id;
END
$$;

-- App-facing: mark the account for deletion and queue the revoke at Apple. Calling it again
-- returns the same job while that deletion is pending or done.
CREATE OR REPLACE FUNCTION siwa.request_deletion(client_id text, sub text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    a siwa.accounts;
    job_id bigint;
BEGIN
    IF coalesce(client_id, '') = '' OR coalesce(sub, '') = '' THEN
        RAISE EXCEPTION 'siwa.request_deletion: client_id and sub are required' USING ERRCODE = '22023';
    END IF;
    INSERT INTO siwa.accounts (client_id, sub, status)
    VALUES (request_deletion.client_id, request_deletion.sub, 'pending_deletion')
    ON CONFLICT DO NOTHING;
    SELECT * INTO a FROM siwa.accounts
     WHERE accounts.client_id = request_deletion.client_id AND accounts.sub = request_deletion.sub FOR UPDATE;

    IF a.status IN ('pending_deletion', 'deleted') THEN
        SELECT id INTO job_id FROM siwa.jobs
         WHERE jobs.client_id = a.client_id AND jobs.sub = a.sub AND kind = 'revoke' AND state <> 'cancelled'
         ORDER BY id DESC LIMIT 1;
        IF job_id IS NOT NULL THEN
            RETURN job_id;
        END IF;
    END IF;

    UPDATE siwa.accounts SET status = 'pending_deletion', updated_at = now()
     WHERE accounts.client_id = a.client_id AND accounts.sub = a.sub;
    -- A pending deletion is never dropped: revoke jobs retry for as long as it takes.
    INSERT INTO siwa.jobs (kind, priority, client_id, sub, max_attempts)
    VALUES ('revoke', 1, a.client_id, a.sub, 2147483647)
    RETURNING id INTO job_id;
    PERFORM siwa.record_change(a.client_id, a.sub, 'deletion_requested', NULL, NULL, job_id);
    RETURN job_id;
END
$$;

-- Privileges: the app calls the app-facing functions; the worker everything here (see queue.sql
-- on PUBLIC).
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA siwa FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_worker') THEN
        GRANT EXECUTE ON FUNCTION siwa.record_change(text, text, text, text, text, bigint),
                                  siwa.link_account(text, text, text, text), siwa.request_deletion(text, text)
           TO siwa_worker;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_app') THEN
        GRANT EXECUTE ON FUNCTION siwa.link_account(text, text, text, text), siwa.request_deletion(text, text)
           TO siwa_app;
    END IF;
END
$$;
