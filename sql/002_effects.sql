-- Queueing triggers, the four effects, and the app-facing functions of the contract.

-- A notification's job is written by the same statement that stores the notification, so the
-- receiver's one INSERT commits both or neither. A statement trigger with a transition table
-- queues a whole batch in one INSERT; ON CONFLICT DO NOTHING keeps duplicates out of it.
CREATE FUNCTION siwa.queue_notification_jobs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO siwa.jobs (kind, priority, client_id, sub, notification_jti)
    SELECT 'notification', 2, client_id, sub, jti FROM new_notifications ORDER BY event_time, jti;
    RETURN NULL;
END
$$;
CREATE TRIGGER notifications_queue_jobs
    AFTER INSERT ON siwa.notifications
    REFERENCING NEW TABLE AS new_notifications
    FOR EACH STATEMENT EXECUTE FUNCTION siwa.queue_notification_jobs();

-- One wake-up per statement, not per job: listeners claim in batches anyway. The payload is the
-- number of new jobs so a worker can size its claim.
CREATE FUNCTION siwa.wake_workers() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    queued bigint;
BEGIN
    SELECT count(*) INTO queued FROM new_jobs;
    IF queued > 0 THEN
        PERFORM pg_notify('siwa_jobs', queued::text);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER jobs_wake_workers
    AFTER INSERT ON siwa.jobs
    REFERENCING NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION siwa.wake_workers();

-- Appends to siwa.account_changes and tells listeners. Every applied effect goes through here.
CREATE FUNCTION siwa.record_change(
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

-- Personal data does not outlive its purpose: once an account is deleted (by the app or at Apple),
-- its notifications keep only what recognises a redelivery (jti) and what happened (type, time).
CREATE FUNCTION siwa.erase_personal_data(p_client_id text, p_sub text) RETURNS void
LANGUAGE sql AS $$
    UPDATE siwa.notifications
       SET email = NULL, jws = NULL, claims = claims - 'events'
     WHERE client_id = p_client_id AND sub = p_sub
       AND (email IS NOT NULL OR jws IS NOT NULL OR claims ? 'events');
    UPDATE siwa.accounts SET email = NULL, is_private_email = NULL
     WHERE client_id = p_client_id AND sub = p_sub AND email IS NOT NULL;
$$;

-- Applies one stored notification to its account and returns the outcome recorded on it.
-- Idempotent (a processed notification returns its recorded outcome) and order-aware (an event
-- older than the state it would overwrite changes nothing).
CREATE FUNCTION siwa.apply_notification(p_jti text, p_job_id bigint) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    n siwa.notifications;
    a siwa.accounts;
    result text;
    forwarding text;
BEGIN
    SELECT * INTO n FROM siwa.notifications WHERE jti = p_jti FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'missing';  -- pruned by retention before it ran; nothing left to apply
    END IF;
    IF n.processed_at IS NOT NULL THEN
        RETURN n.outcome;
    END IF;

    IF n.event_type NOT IN ('consent-revoked', 'account-deleted', 'email-enabled', 'email-disabled') THEN
        result := 'ignored_unknown_type';
    ELSE
        -- Apple only notifies about users who signed in, so an unknown sub is a link we never saw.
        INSERT INTO siwa.accounts (client_id, sub, status) VALUES (n.client_id, n.sub, 'active')
        ON CONFLICT DO NOTHING;
        SELECT * INTO a FROM siwa.accounts WHERE client_id = n.client_id AND sub = n.sub FOR UPDATE;

        IF a.status = 'deleted' THEN
            -- Includes Apple's consent-revoked answering our own revoke: it must not revive the row.
            result := 'ignored_account_deleted';
        ELSIF a.linked_at IS NOT NULL AND n.event_time < a.linked_at THEN
            result := 'stale';
        ELSIF n.event_type = 'consent-revoked' THEN
            IF a.status IN ('consent_revoked', 'apple_account_deleted') THEN
                result := 'no_change';
            ELSE
                -- pending_deletion stays: the revoke job finishes it, now without a token.
                UPDATE siwa.accounts
                   SET status = CASE WHEN status = 'pending_deletion' THEN status ELSE 'consent_revoked' END,
                       refresh_token_enc = NULL, sessions_revoked_at = now(), updated_at = now()
                 WHERE client_id = n.client_id AND sub = n.sub;
                PERFORM siwa.record_change(n.client_id, n.sub, 'consent_revoked', NULL, n.jti, p_job_id);
                result := 'applied';
            END IF;
        ELSIF n.event_type = 'account-deleted' THEN
            IF a.status = 'apple_account_deleted' THEN
                result := 'no_change';
            ELSE
                UPDATE siwa.accounts
                   SET status = CASE WHEN status = 'pending_deletion' THEN status ELSE 'apple_account_deleted' END,
                       refresh_token_enc = NULL, sessions_revoked_at = now(), updated_at = now()
                 WHERE client_id = n.client_id AND sub = n.sub;
                PERFORM siwa.record_change(n.client_id, n.sub, 'apple_account_deleted', NULL, n.jti, p_job_id);
                result := 'applied';
            END IF;
        ELSE
            forwarding := CASE n.event_type WHEN 'email-enabled' THEN 'enabled' ELSE 'disabled' END;
            IF a.status IN ('apple_account_deleted', 'pending_deletion') THEN
                result := 'ignored_account_deleted';
            ELSIF a.last_email_event_at IS NOT NULL AND n.event_time < a.last_email_event_at THEN
                result := 'stale';
            ELSIF a.last_email_event_at = n.event_time AND a.email_forwarding = forwarding THEN
                result := 'no_change';
            ELSE
                UPDATE siwa.accounts
                   SET email_forwarding = forwarding,
                       email = coalesce(n.email, email),
                       is_private_email = coalesce(n.is_private_email, is_private_email),
                       last_email_event_at = n.event_time,
                       updated_at = now()
                 WHERE client_id = n.client_id AND sub = n.sub;
                PERFORM siwa.record_change(n.client_id, n.sub, 'email_' || forwarding, NULL, n.jti, p_job_id);
                result := 'applied';
            END IF;
        END IF;
    END IF;

    UPDATE siwa.notifications SET processed_at = now(), outcome = result WHERE jti = p_jti;
    IF EXISTS (SELECT 1 FROM siwa.accounts
                WHERE client_id = n.client_id AND sub = n.sub AND status IN ('deleted', 'apple_account_deleted')) THEN
        PERFORM siwa.erase_personal_data(n.client_id, n.sub);
    END IF;
    RETURN result;
END
$$;

-- App-facing: queue the exchange of a fresh authorization code (codes live five minutes, single
-- use). Runs first in the queue. The worker removes the code from the row once it is used.
CREATE FUNCTION siwa.link_account(client_id text, sub text, app_user_id text, authorization_code text)
RETURNS bigint
LANGUAGE plpgsql AS $$
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
CREATE FUNCTION siwa.request_deletion(client_id text, sub text) RETURNS bigint
LANGUAGE plpgsql AS $$
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
