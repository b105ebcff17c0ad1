-- The account lifecycle: the account rules (siwa.account_effect) and the entry points every
-- path calls (the app's functions, the worker's exchange, revoke and reconcile handlers, the app
-- API's sign-in). The Swift handlers only talk to Apple and hand the outcome to these functions.
-- Notifications go through the same rules in sql/functions/notifications.sql.
-- Applied after the numbered migrations whenever this file changes (see sql/README.md).

-- The lists the rules are made of, each stated once. Inlined by the planner wherever they are
-- used (SQL, IMMUTABLE or STABLE, no SET clause: the bodies name only built-in operators and
-- schema-qualified functions), so the notification batch's set-based statements pay no call.
-- Apple's four event types; any other type changes no account (`ignored_unknown_type`).
CREATE OR REPLACE FUNCTION siwa.apple_event_known(p_type text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_type IN ('consent-revoked', 'account-deleted', 'email-enabled', 'email-disabled')
$$;

-- Apple's two email events: they set email forwarding and may bring the email.
CREATE OR REPLACE FUNCTION siwa.email_event(p_type text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_type IN ('email-enabled', 'email-disabled')
$$;

-- The statuses an email event changes nothing in (`ignored_account_deleted`): the account is
-- gone at Apple, gone here, or going. NULL for no account (an email event then creates it).
CREATE OR REPLACE FUNCTION siwa.ignores_email_events(p_status text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_status IN ('deleted', 'apple_account_deleted', 'pending_deletion')
$$;

-- THE ACCOUNT RULES: what `p_event` does to an account in `p_status` (NULL: no row yet), every
-- part of it in one value (the type's columns: sql/018_account_effect.sql). Every path that
-- changes an account's status asks this and does what it says: the notification batch
-- (siwa.apply_notifications, and so siwa.apply_notification), a link or sign-in
-- (siwa.account_linked), siwa.request_deletion, a deletion's end (siwa.revoke_step),
-- reconciliation (siwa.reconcile_skip, siwa.reconcile_result), team
-- transfer (siwa.complete_transfer) and a token import (siwa.account_imported). One line per
-- (event, status); an event that does not apply does nothing (next_status is the status, no flag,
-- no change). Tests/IntegrationTests/AccountEffectTableTests.swift holds the same table as
-- sentences, checked against this and against what the notification batch does to real rows:
-- changing what an event does is one line here and one row there.
--
-- Pure and inlined by the planner (no SET clause, no relation named); callers that read several
-- columns for many rows compute it once per row (siwa.apply_notifications does, in a CTE).
-- Not decided here, on purpose:
--   - the order of events: an event older than the state it would overwrite is `stale`
--     (siwa.notification_outcome, notifications.sql: event_time against linked_at and the last
--     email event; a late link against the deletion requested since: siwa.exchange_succeeded,
--     siwa.sign_in_succeeded); a repeated deletion request is answered with its pending job
--     (siwa.request_deletion); reconciliation's answer only counts for the token still stored;
--   - the data an event carries (the email an email event brings, the token a link brings).
--
-- Events: Apple's four (`consent-revoked`, `account-deleted`, `email-enabled`, `email-disabled`);
-- `linked` (an exchange or a sign-in); `late_link` (a token that belongs to a deletion: the
-- deletion's own code, or a link queued before a deletion that has finished since);
-- `deletion_requested`; `deletion_finished` (every token revoked); `reconcile_invalid_grant` (Apple
-- says the stored token is dead); `transferred` (team transfer: an imported line becomes this account);
-- `imported` (`siwa accounts import`: a refresh token from before this system).
CREATE OR REPLACE FUNCTION siwa.account_effect(p_status text, p_event text) RETURNS siwa.account_effect
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE p_event
    --                          next_status         outcome                   ends   ends  erases email  change
    --                                                                        grant  sess. data   fwd.
    WHEN 'consent-revoked' THEN CASE
        WHEN p_status = 'deleted'  -- Apple answers our own revoke with consent-revoked: it must not revive the row
            THEN ROW(p_status,          'ignored_account_deleted', false, false, false, NULL, NULL)::siwa.account_effect
        WHEN p_status IN ('consent_revoked', 'apple_account_deleted')
            THEN ROW(p_status,          'no_change',               false, false, false, NULL, NULL)::siwa.account_effect
        WHEN p_status = 'pending_deletion'  -- its revoke still revokes every token (Apple answers 200 for a dead one)
            THEN ROW(p_status,          'applied',                 false, true,  false, NULL, 'consent_revoked')::siwa.account_effect
        ELSE ROW('consent_revoked',     'applied',                 true,  true,  false, NULL, 'consent_revoked')::siwa.account_effect
        END
    WHEN 'account-deleted' THEN CASE
        WHEN p_status = 'deleted'
            THEN ROW(p_status,          'ignored_account_deleted', false, false, false, NULL, NULL)::siwa.account_effect
        WHEN p_status = 'apple_account_deleted'
            THEN ROW(p_status,          'no_change',               false, false, false, NULL, NULL)::siwa.account_effect
        WHEN p_status = 'pending_deletion'  -- the deletion finishes, and erases, on its own
            THEN ROW(p_status,          'applied',                 false, true,  false, NULL, 'apple_account_deleted')::siwa.account_effect
        ELSE ROW('apple_account_deleted', 'applied',               true,  true,  true,  NULL, 'apple_account_deleted')::siwa.account_effect
        END
    WHEN 'email-enabled' THEN CASE
        WHEN siwa.ignores_email_events(p_status)
            THEN ROW(p_status,          'ignored_account_deleted', false, false, false, NULL, NULL)::siwa.account_effect
        ELSE ROW(coalesce(p_status, 'active'), 'applied',          false, false, false, 'enabled', 'email_enabled')::siwa.account_effect
        END
    WHEN 'email-disabled' THEN CASE
        WHEN siwa.ignores_email_events(p_status)
            THEN ROW(p_status,          'ignored_account_deleted', false, false, false, NULL, NULL)::siwa.account_effect
        ELSE ROW(coalesce(p_status, 'active'), 'applied',          false, false, false, 'disabled', 'email_disabled')::siwa.account_effect
        END
    WHEN 'linked' THEN CASE
        WHEN p_status = 'pending_deletion'  -- its token is kept for the deletion to revoke
            THEN ROW(p_status,          'ignored_account_deleted', false, false, false, NULL, NULL)::siwa.account_effect
        ELSE ROW('active',              'applied',                 false, false, false, NULL, 'linked')::siwa.account_effect  -- after deleted: a new life
        END
    WHEN 'late_link'  -- its token goes to the deletion (kept, or revoked by a late revoke job)
        THEN ROW(p_status,              'ignored_account_deleted', false, false, false, NULL, NULL)::siwa.account_effect
    WHEN 'deletion_requested'  -- a repeat is answered with its pending job before this (siwa.request_deletion)
        THEN ROW('pending_deletion',    'applied',                 false, false, false, NULL, 'deletion_requested')::siwa.account_effect
    WHEN 'deletion_finished' THEN CASE
        WHEN p_status = 'pending_deletion'  -- its revoke removed every token already
            THEN ROW('deleted',         'applied',                 false, true,  true,  NULL, 'deleted')::siwa.account_effect
        ELSE ROW(p_status,              'no_change',               false, false, false, NULL, NULL)::siwa.account_effect
        END
    WHEN 'reconcile_invalid_grant' THEN CASE
        WHEN p_status = 'active'
            THEN ROW('consent_revoked', 'applied',                 true,  true,  false, NULL, 'consent_revoked')::siwa.account_effect
        WHEN p_status IN ('pending_deletion', 'deleted')
            THEN ROW(p_status,          'ignored_account_deleted', false, false, false, NULL, NULL)::siwa.account_effect
        ELSE ROW(p_status,              'no_change',               false, false, false, NULL, NULL)::siwa.account_effect
        END
    WHEN 'transferred' THEN CASE
        WHEN p_status IN ('pending_deletion', 'deleted')  -- the imported line is skipped, never brought back
            THEN ROW(p_status,          'ignored_account_deleted', false, false, false, NULL, NULL)::siwa.account_effect
        -- the old team's tokens are useless to the new one (and sealed with the old sub)
        ELSE ROW('active',              'applied',                 true,  false, false, NULL, 'transferred')::siwa.account_effect
        END
    WHEN 'imported' THEN CASE  -- the account takes the token only when it holds none (siwa.account_imported)
        WHEN p_status IN ('pending_deletion', 'deleted')  -- its token goes to the deletion (kept, or revoked by a late revoke job)
            THEN ROW(p_status,          'ignored_account_deleted', false, false, false, NULL, NULL)::siwa.account_effect
        WHEN p_status IN ('consent_revoked', 'apple_account_deleted')  -- Apple ended the grant: an older token does not revive it
            THEN ROW(p_status,          'no_change',               false, false, false, NULL, NULL)::siwa.account_effect
        ELSE ROW('active',              'applied',                 false, false, false, NULL, 'imported')::siwa.account_effect
        END
    ELSE ROW(p_status,                  'ignored_unknown_type',    false, false, false, NULL, NULL)::siwa.account_effect
    END
$$;

-- The helpers account_effect replaced (nothing calls them since).
DROP FUNCTION IF EXISTS siwa.account_next_status(text, text);
DROP FUNCTION IF EXISTS siwa.account_event_ends_grant(text, text);

-- THE CHANGE FEED'S ONE WRITER: appends changes to siwa.account_changes in the order given (ids
-- follow it) and sends NOTIFY siwa_account_changes for each, with siwa.change_payload (bounded
-- whatever the app stores: PostgreSQL refuses payloads of 8000 bytes or more; the listener reads
-- the row for the rest). Every applied effect goes through here: one change at a time through
-- siwa.record_change, a round of the notification batch at once (siwa.apply_notifications: one
-- call a round, set-based, never one a row). The caller holds the accounts' row locks. The rows'
-- statement trigger queues their webhook deliveries (siwa.queue_webhook_deliveries, jobs.sql).
-- Returns the new ids, in order.
CREATE OR REPLACE FUNCTION siwa.record_changes(
    p_client_ids text[], p_subs text[], p_app_user_ids text[], p_changes text[], p_statuses text[],
    p_reasons text[], p_jtis text[], p_job_ids bigint[]
) RETURNS SETOF bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN QUERY
    WITH c AS (
        INSERT INTO siwa.account_changes (client_id, sub, app_user_id, change, status, reason, notification_jti, job_id)
        SELECT u.client_id, u.sub, u.app_user_id, u.change, u.status, u.reason, u.jti, u.job_id
          FROM unnest(p_client_ids, p_subs, p_app_user_ids, p_changes, p_statuses, p_reasons, p_jtis, p_job_ids)
               WITH ORDINALITY AS u(client_id, sub, app_user_id, change, status, reason, jti, job_id, ord)
         ORDER BY u.ord
        RETURNING account_changes.id, account_changes.client_id, account_changes.sub, account_changes.change,
                  account_changes.status
    )
    SELECT c.id FROM c, pg_notify('siwa_account_changes', siwa.change_payload(c.id, c.client_id, c.sub, c.change, c.status));
END
$$;

-- One change of one account (its app_user_id and status as the row holds them now), through
-- siwa.record_changes.
-- The account's row is locked before the change takes its id (most callers hold it already): ids
-- of one account then follow the order their transactions commit, which webhook deliveries rely
-- on (sent lowest id first per account). A caller that had not locked it (a link's failed
-- exchange) could otherwise take an id, and another writer a later one and commit first.
CREATE OR REPLACE FUNCTION siwa.record_change(
    p_client_id text, p_sub text, p_change text, p_reason text, p_jti text, p_job_id bigint
) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    account siwa.accounts;
    change_id bigint;
BEGIN
    SELECT * INTO account FROM siwa.accounts WHERE client_id = p_client_id AND sub = p_sub FOR UPDATE;
    IF NOT FOUND THEN
        -- No row to lock, but another transaction may be creating it (a deletion requested for a
        -- sub whose queued link had not created it yet): its change took the smaller id and may
        -- commit after ours. Hold the key as an inserter does: ON CONFLICT waits for an uncommitted
        -- row with it and then reads it; a row inserted and deleted here makes a later inserter wait
        -- for this transaction. Rare (a change for an account that does not exist).
        INSERT INTO siwa.accounts (client_id, sub, status) VALUES (p_client_id, p_sub, 'deleted')
        ON CONFLICT (client_id, sub) DO NOTHING;
        IF FOUND THEN
            DELETE FROM siwa.accounts WHERE client_id = p_client_id AND sub = p_sub;
        ELSE
            SELECT * INTO account FROM siwa.accounts WHERE client_id = p_client_id AND sub = p_sub FOR UPDATE;
        END IF;
    END IF;
    SELECT c INTO change_id
      FROM siwa.record_changes(ARRAY[p_client_id], ARRAY[p_sub], ARRAY[account.app_user_id], ARRAY[p_change],
                               ARRAY[account.status], ARRAY[p_reason], ARRAY[p_jti], ARRAY[p_job_id]) AS c;
    RETURN change_id;
END
$$;

-- Applies an effect that brings no data of its own (a deletion requested, a deletion's end,
-- reconciliation's invalid_grant) to the account row the caller holds locked, with its change and
-- NOTIFY (siwa.record_change) and, when the effect says so, the erasure of its personal data
-- (siwa.erase_personal_data, after the change row that carries the app_user_id). p_effect:
-- siwa.account_effect's answer for the account's status, applied (the caller judged that). The
-- grant's end discards the tokens (the caller revokes those Apple may still honour first); the
-- sessions end now, unless they ended while a deletion was pending (a consent-revoked then): the
-- deletion's end keeps that time. p_token_checked: Apple has just answered for the stored token.
-- The effects that bring data (a link, an import, a transfer, Apple's events) write their columns
-- with the effect's in one statement each, here in this file (the notification batch's in
-- notifications.sql, set-based).
CREATE OR REPLACE FUNCTION siwa.apply_account_effect(
    p_client_id text, p_sub text, p_effect siwa.account_effect, p_reason text, p_job_id bigint, p_token_checked boolean
) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE siwa.accounts a
       SET status = p_effect.next_status,
           refresh_token_enc = CASE WHEN p_effect.ends_grant THEN NULL ELSE a.refresh_token_enc END,
           retired_tokens_enc = CASE WHEN p_effect.ends_grant THEN '{}' ELSE a.retired_tokens_enc END,
           sessions_revoked_at = CASE WHEN NOT p_effect.ends_sessions THEN a.sessions_revoked_at
                                      WHEN a.status = 'pending_deletion' THEN coalesce(a.sessions_revoked_at, now())
                                      ELSE now() END,
           token_checked_at = CASE WHEN p_token_checked THEN now() ELSE a.token_checked_at END,
           updated_at = now()
     WHERE a.client_id = p_client_id AND a.sub = p_sub;
    PERFORM siwa.record_change(p_client_id, p_sub, p_effect.change, p_reason, NULL, p_job_id);
    IF p_effect.erases_personal_data THEN
        PERFORM siwa.erase_personal_data(p_client_id, p_sub);
    END IF;
END
$$;

-- The client IDs whose accounts share users with p_client_id (SIWA_APP_GROUPS, written to
-- siwa.app_groups by the worker at start), itself included, in a fixed order (callers lock in it).
CREATE OR REPLACE FUNCTION siwa.group_client_ids(p_client_id text) RETURNS SETOF text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT c FROM (SELECT m.client_id AS c FROM siwa.app_groups g JOIN siwa.app_groups m ON m.group_id = g.group_id
                    WHERE g.client_id = p_client_id
                   UNION SELECT p_client_id) u
     ORDER BY c
$$;

-- Whether a deletion is pending for p_sub under any client ID of p_client_id's group: it blocks a
-- sign-in and a link under every one of them. The callers check the account's own status
-- themselves; a client ID in no group (most deployments) costs one probe of siwa.app_groups and
-- never reads siwa.accounts (every sign-in asks this).
CREATE OR REPLACE FUNCTION siwa.group_deletion_pending(p_client_id text, p_sub text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM siwa.app_groups g
                     JOIN siwa.app_groups m ON m.group_id = g.group_id
                     JOIN siwa.accounts a ON a.client_id = m.client_id AND a.sub = p_sub
                    WHERE g.client_id = p_client_id AND a.status = 'pending_deletion')
$$;

-- A pending deletion blocks a new link or sign-in: the account's own (p_status, read by the
-- caller) or one under another client ID of the user's app group. The one rule for
-- siwa.link_account (SQLSTATE 55000) and the app API's sign-in (siwa.sign_in_state,
-- siwa.consume_nonce_reading: answered as `pending_deletion`). Inlined (no SET clause).
CREATE OR REPLACE FUNCTION siwa.deletion_blocks_link(p_status text, p_client_id text, p_sub text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT p_status IS NOT DISTINCT FROM 'pending_deletion' OR siwa.group_deletion_pending(p_client_id, p_sub)
$$;

-- The NOTIFY siwa_account_changes payload: the change's id, client_id, sub, change and status,
-- nothing the app stores. client_id and sub are Apple's (a few dozen bytes). STABLE, as
-- json_build_object is: declared IMMUTABLE it was not inlined, and ran as a function call of its
-- own for every change of a batch (4 % of a batch's time, deploy/bench/worker.sh's profile).
CREATE OR REPLACE FUNCTION siwa.change_payload(
    p_id bigint, p_client_id text, p_sub text, p_change text, p_status text
) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT json_build_object('id', p_id, 'client_id', left(p_client_id, 255), 'sub', left(p_sub, 255),
                             'change', p_change, 'status', p_status)::text
$$;

-- Locks the account row (FOR UPDATE), creating it in `p_status` when missing. Returns whether it
-- was created; the caller reads the row.
CREATE OR REPLACE FUNCTION siwa.lock_account(p_client_id text, p_sub text, p_status text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    created boolean;
BEGIN
    PERFORM 1 FROM siwa.accounts a WHERE a.client_id = p_client_id AND a.sub = p_sub FOR UPDATE;
    IF FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO siwa.accounts AS a (client_id, sub, status) VALUES (p_client_id, p_sub, p_status)
    ON CONFLICT (client_id, sub) DO NOTHING
    RETURNING true INTO created;
    IF created THEN
        RETURN true;  -- no other transaction sees a row this one inserted: nothing more to lock
    END IF;
    -- Created by a concurrent transaction meanwhile: lock theirs.
    PERFORM 1 FROM siwa.accounts a WHERE a.client_id = p_client_id AND a.sub = p_sub FOR UPDATE;
    RETURN false;
END
$$;

-- The reason of a `linked` change: NULL for a link (its exchange job is the change's job_id);
-- for the app API's sign-in, whether it exchanged a code at Apple (`sign_in_code_exchanged`) or
-- came with an identity token only (`sign_in`).
CREATE OR REPLACE FUNCTION siwa.sign_in_reason(p_job_id bigint, p_token_enc bytea) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_job_id IS NOT NULL THEN NULL
                WHEN p_token_enc IS NOT NULL THEN 'sign_in_code_exchanged'
                ELSE 'sign_in' END
$$;

-- A refresh token obtained from Apple (an exchange or a sign-in) for (p_client_id, p_sub), and the
-- identity it came with. The one place a token enters an account:
--   - `linked`: the account is active (a new life after deleted, consent_revoked or
--     apple_account_deleted); a token it replaces is kept for a later deletion to revoke;
--   - pending deletion: the status stays, the token is kept for the deletion to revoke;
--   - `late_link` (p_queued_before_deletion and the deletion already finished): the account stays
--     deleted and a revoke job revokes the token.
-- p_token_enc NULL (a sign-in without a code) only changes the status. Idempotent: a token already
-- stored changes nothing. Returns the status after it and whether the account row was created.
CREATE OR REPLACE FUNCTION siwa.account_linked(
    p_client_id text, p_sub text, p_app_user_id text, p_token_enc bytea, p_email text, p_is_private_email boolean,
    p_for_deletion boolean, p_queued_before_deletion boolean, p_job_id bigint,
    OUT result_status text, OUT result_created boolean, OUT result_change text)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    a siwa.accounts;
    event text;
    effect siwa.account_effect;
BEGIN
    -- Locked and read in one statement when the row exists (a sign-in has locked it already).
    SELECT * INTO a FROM siwa.accounts WHERE client_id = p_client_id AND sub = p_sub FOR UPDATE;
    result_created := false;
    IF NOT FOUND THEN
        result_created := siwa.lock_account(p_client_id, p_sub, 'active');
        SELECT * INTO a FROM siwa.accounts WHERE client_id = p_client_id AND sub = p_sub;
    END IF;
    IF p_token_enc IS NOT NULL AND (a.refresh_token_enc = p_token_enc OR p_token_enc = ANY (a.retired_tokens_enc)) THEN
        result_status := a.status;
        RETURN;
    END IF;
    event := CASE WHEN p_for_deletion OR (a.status = 'deleted' AND p_queued_before_deletion) THEN 'late_link'
                  ELSE 'linked' END;
    effect := siwa.account_effect(CASE WHEN result_created THEN NULL ELSE a.status END, event);
    result_status := coalesce(effect.next_status, a.status);  -- a row created for a late link: as created

    IF effect.outcome = 'applied' THEN
        -- A user whose account was deleted (by the app or at Apple) comes back as somebody new: the
        -- caller answers `new`, and no app_user_id of the old life is handed back (it was erased
        -- when the account got there; a row from before that rule may still carry one).
        result_created := result_created OR a.status IN ('deleted', 'apple_account_deleted');
        UPDATE siwa.accounts
           SET status = effect.next_status,
               -- A link queued before a deletion carries the app_user_id of the life that deletion
               -- ended: a life begun since keeps its own.
               app_user_id = CASE WHEN a.status IN ('deleted', 'apple_account_deleted') THEN p_app_user_id
                                  WHEN p_queued_before_deletion THEN accounts.app_user_id
                                  ELSE coalesce(p_app_user_id, accounts.app_user_id) END,
               email = coalesce(p_email, accounts.email),
               is_private_email = coalesce(p_is_private_email, accounts.is_private_email),
               refresh_token_enc = coalesce(p_token_enc, accounts.refresh_token_enc),
               -- Bounded: a returning user's every sign-in with a code adds one. Past the bound
               -- the oldest goes unrevoked; a deletion's revoke of the current token ends the
               -- user's authorization at Apple, and the tokens issued under it with it.
               retired_tokens_enc = CASE WHEN p_token_enc IS NOT NULL AND accounts.refresh_token_enc IS NOT NULL
                                         THEN (accounts.retired_tokens_enc || accounts.refresh_token_enc)
                                              [greatest(1, cardinality(accounts.retired_tokens_enc) + 2 - 16):]
                                         ELSE accounts.retired_tokens_enc END,
               linked_at = now(),
               token_checked_at = CASE WHEN p_token_enc IS NOT NULL THEN now() ELSE accounts.token_checked_at END,
               updated_at = now()
         WHERE client_id = p_client_id AND sub = p_sub;
        result_change := effect.change;
        -- No job: the app API's sign-in, which exchanged its code itself (or had none); the reason
        -- says so, as a link's job does, for the app and the console's timeline.
        PERFORM siwa.record_change(p_client_id, p_sub, result_change, siwa.sign_in_reason(p_job_id, p_token_enc), NULL, p_job_id);
    ELSIF p_token_enc IS NOT NULL AND result_status NOT IN ('pending_deletion', 'deleted') THEN
        -- A deletion's own code whose deletion has finished and a new life begun since: its token
        -- was obtained to be revoked, and is, by a job of its own (never kept by the new life,
        -- where an ending event would drop it).
        PERFORM siwa.revoke_token_later(p_client_id, p_sub, p_token_enc, 'deletion_code');
    ELSIF p_token_enc IS NOT NULL THEN
        -- Kept for a deletion: the pending one, or a revoke queued now for a finished one. The
        -- app_user_id only while pending: a deleted account has forgotten who it was.
        UPDATE siwa.accounts
           SET app_user_id = CASE WHEN accounts.status = 'pending_deletion'
                                  THEN coalesce(accounts.app_user_id, p_app_user_id) END,
               refresh_token_enc = CASE WHEN accounts.status = 'pending_deletion' AND accounts.refresh_token_enc IS NULL
                                        THEN p_token_enc ELSE accounts.refresh_token_enc END,
               retired_tokens_enc = CASE WHEN accounts.status = 'pending_deletion' AND accounts.refresh_token_enc IS NULL
                                         THEN accounts.retired_tokens_enc
                                         ELSE accounts.retired_tokens_enc || p_token_enc END,
               updated_at = now()
         WHERE client_id = p_client_id AND sub = p_sub;
        IF result_status = 'deleted' THEN
            PERFORM siwa.queue_revoke(p_client_id, p_sub, '{"late_token": true}');
        END IF;
    END IF;
END
$$;

-- `siwa accounts import`: a refresh token from before this system (sealed for the row). What the
-- import does to the account is siwa.account_effect's `imported` (a new or active account:
-- active, change `imported`; a deletion: the token goes to it; the statuses whose grant Apple ended:
-- nothing). Which token is current is the data's rule, decided here: an account that holds a token
-- got it from this system, so it is the newer one and stays current (reconciliation checks it),
-- and the imported one is held for a later deletion to revoke, with no change recorded (the app
-- sees nothing new). Made current, an older token that Apple has ended would read as consent
-- withdrawn. A finished deletion never saw the token: a late revoke job revokes it, as for a late
-- link. Returns whether the account holds it now.
CREATE OR REPLACE FUNCTION siwa.account_imported(
    p_client_id text, p_sub text, p_app_user_id text, p_token_enc bytea
) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    created boolean;
    a siwa.accounts;
    effect siwa.account_effect;
BEGIN
    created := siwa.lock_account(p_client_id, p_sub, (siwa.account_effect(NULL, 'imported')).next_status);
    SELECT * INTO a FROM siwa.accounts WHERE client_id = p_client_id AND sub = p_sub;
    IF a.refresh_token_enc = p_token_enc OR p_token_enc = ANY (a.retired_tokens_enc) THEN
        RETURN false;
    END IF;
    effect := siwa.account_effect(CASE WHEN created THEN NULL ELSE a.status END, 'imported');
    -- A token from before this system is older than every grant end this account has seen: a
    -- deletion (requested, or done), an ending event (sessions_revoked_at), Apple's own. Its life
    -- is over: it is revoked by a job of its own, never made current nor dropped (a deletion in
    -- progress takes it below).
    IF NOT created AND a.status NOT IN ('pending_deletion', 'deleted')
       AND (a.deletion_requests > 0 OR a.sessions_revoked_at IS NOT NULL OR effect.outcome <> 'applied') THEN
        PERFORM siwa.revoke_token_later(p_client_id, p_sub, p_token_enc, 'imported_after_grant_ended');
        RETURN false;
    END IF;
    IF effect.outcome = 'applied' AND a.refresh_token_enc IS NULL THEN
        UPDATE siwa.accounts
           SET status = effect.next_status,
               app_user_id = coalesce(p_app_user_id, accounts.app_user_id),
               refresh_token_enc = p_token_enc,
               linked_at = CASE WHEN created THEN now() ELSE accounts.linked_at END,
               updated_at = now()
         WHERE client_id = p_client_id AND sub = p_sub;
        PERFORM siwa.record_change(p_client_id, p_sub, effect.change, NULL, NULL, NULL);
        RETURN true;
    ELSIF effect.outcome = 'applied' THEN
        UPDATE siwa.accounts
           SET app_user_id = coalesce(accounts.app_user_id, p_app_user_id),
               retired_tokens_enc = accounts.retired_tokens_enc || p_token_enc, updated_at = now()
         WHERE client_id = p_client_id AND sub = p_sub;
        RETURN true;
    ELSIF effect.outcome = 'ignored_account_deleted' THEN
        UPDATE siwa.accounts SET retired_tokens_enc = accounts.retired_tokens_enc || p_token_enc, updated_at = now()
         WHERE client_id = p_client_id AND sub = p_sub;
        IF a.status = 'deleted' THEN
            PERFORM siwa.queue_revoke(p_client_id, p_sub, '{"late_token": true}');
        END IF;
    END IF;
    RETURN false;
END
$$;

-- ExchangeJobHandler: Apple answered the exchange of job p_job_id with a token (sealed for the
-- row) and a verified identity. Applied whether or not the job's lease still holds: the code is
-- spent at Apple, so this token is the only one the link will get. Completes the job (a run
-- that lost the lease can then no longer fail it). Returns the account's status after it.
CREATE OR REPLACE FUNCTION siwa.exchange_succeeded(
    p_job_id bigint, p_token_enc bytea, p_email text, p_is_private_email boolean
) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    j siwa.jobs;
    result record;
    deletion_after boolean;
BEGIN
    SELECT * INTO j FROM siwa.jobs WHERE id = p_job_id AND kind = 'exchange' FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'siwa.exchange_succeeded: no exchange job %', p_job_id USING ERRCODE = 'P0002';
    END IF;
    -- A deletion requested after this link was queued (its revoke job is younger) is not undone by it.
    -- A late token's revoke (an import or a late exchange after a finished deletion) is no
    -- deletion request: counted as one, it turned a new life's link into a revoked token.
    SELECT EXISTS (SELECT 1 FROM siwa.jobs r
                    WHERE r.client_id = j.client_id AND r.sub = j.sub AND r.kind = 'revoke' AND r.id > j.id
                      AND NOT r.args ? 'late_token')
      INTO deletion_after;
    SELECT * INTO result
      FROM siwa.account_linked(j.client_id, j.sub, j.args->>'app_user_id', p_token_enc, p_email, p_is_private_email,
                               coalesce(j.args->>'purpose', '') = 'deletion', deletion_after, j.id);
    PERFORM siwa.complete_job(p_job_id, NULL,
                              CASE WHEN result.result_change = 'linked' THEN 'linked' ELSE 'token_kept_for_deletion' END);
    RETURN result.result_status;
END
$$;

-- ExchangeJobHandler: the exchange of job p_job_id cannot succeed (invalid_grant, a bad id_token,
-- an expired code, retries exhausted). Fenced by the lease (state running, p_attempt): false when
-- it was lost, and nothing is written. The code is removed; the account is untouched; a link
-- records `link_failed` with the reason.
CREATE OR REPLACE FUNCTION siwa.exchange_failed(p_job_id bigint, p_attempt integer, p_reason text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    j siwa.jobs;
    result_outcome text;
BEGIN
    SELECT * INTO j FROM siwa.jobs WHERE id = p_job_id AND kind = 'exchange' FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    result_outcome := CASE WHEN j.args->>'purpose' = 'deletion' THEN 'code_failed' ELSE 'link_failed' END;
    IF NOT siwa.complete_job(p_job_id, p_attempt, result_outcome) THEN
        RETURN false;
    END IF;
    IF result_outcome = 'link_failed' THEN
        PERFORM siwa.record_change(j.client_id, j.sub, 'link_failed', p_reason, NULL, j.id);
    END IF;
    RETURN true;
END
$$;

-- RevokeJobHandler, one step of a deletion (the handler loops: revoke what this returns, report
-- it with siwa.revoke_succeeded, ask again). Decided under the account's row lock and fenced by
-- the job's lease:
--   `lost`       the lease was lost: stop, write nothing;
--   `wait`       an exchange for the account is queued or running (a link queued before the
--                deletion, or the deletion's own code): snooze `wait_seconds`, its token comes first;
--   `revoke`     revoke `token_enc` at Apple;
--   `deleted`    nothing left to revoke: the account is deleted, its personal data erased, the
--                `deleted` change recorded (reason `revoked`, or `no_token` when this deletion revoked
--                nothing) and the job completed, in this transaction;
--   `done`       a revoke of tokens found after a finished deletion has no more to do (completed);
--   `superseded` the account is no longer pending deletion (completed).
CREATE OR REPLACE FUNCTION siwa.revoke_step(p_job_id bigint, p_attempt integer)
RETURNS TABLE (action text, token_enc bytea, wait_seconds double precision)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    j siwa.jobs;
    a siwa.accounts;
    waiting double precision;
    reason text;
    effect siwa.account_effect;
BEGIN
    SELECT * INTO j FROM siwa.jobs WHERE id = p_job_id AND state = 'running' AND attempt = p_attempt FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'lost'::text, NULL::bytea, NULL::double precision;
        RETURN;
    END IF;
    -- A token of its own (siwa.revoke_token_later): revoked once, then done; the account is not
    -- this job's business.
    IF j.args ? 'token_enc' THEN
        IF coalesce((j.args->>'revoked')::integer, 0) = 0 THEN
            RETURN QUERY SELECT 'revoke'::text, decode(j.args->>'token_enc', 'base64'), NULL::double precision;
        ELSE
            PERFORM siwa.complete_job(j.id, p_attempt, 'token_revoked');
            RETURN QUERY SELECT 'done'::text, NULL::bytea, NULL::double precision;
        END IF;
        RETURN;
    END IF;
    SELECT * INTO a FROM siwa.accounts WHERE client_id = j.client_id AND sub = j.sub FOR UPDATE;

    IF a.status = 'pending_deletion' THEN
        SELECT max(CASE WHEN e.state = 'running' THEN 1
                        ELSE greatest(1, least(30, extract(epoch FROM e.run_at - now()))) END)
          INTO waiting
          FROM siwa.jobs e
         WHERE e.client_id = j.client_id AND e.sub = j.sub AND e.kind = 'exchange'
           AND e.state IN ('available', 'running');
        IF waiting IS NOT NULL THEN
            RETURN QUERY SELECT 'wait'::text, NULL::bytea, waiting;
            RETURN;
        END IF;
    END IF;

    IF a.status IN ('pending_deletion', 'deleted') THEN
        IF a.refresh_token_enc IS NOT NULL OR cardinality(a.retired_tokens_enc) > 0 THEN
            RETURN QUERY SELECT 'revoke'::text, coalesce(a.refresh_token_enc, a.retired_tokens_enc[1]), NULL::double precision;
            RETURN;
        END IF;
    END IF;

    effect := siwa.account_effect(a.status, 'deletion_finished');
    IF effect.outcome = 'applied' THEN
        reason := CASE WHEN coalesce((j.args->>'revoked')::integer, 0) > 0 THEN 'revoked' ELSE 'no_token' END;
        -- Sessions ended earlier (a consent-revoked while pending) keep that time. The change row
        -- before the erasure: it carries the app_user_id, so the app knows whom to delete.
        PERFORM siwa.apply_account_effect(a.client_id, a.sub, effect, reason, j.id, false);
        PERFORM siwa.complete_job(j.id, p_attempt, CASE reason WHEN 'revoked' THEN 'deleted' ELSE 'deleted_without_token' END);
        RETURN QUERY SELECT 'deleted'::text, NULL::bytea, NULL::double precision;
        RETURN;
    END IF;

    PERFORM siwa.complete_job(j.id, p_attempt, CASE WHEN a.status = 'deleted' THEN 'done' ELSE 'superseded' END);
    RETURN QUERY SELECT CASE WHEN a.status = 'deleted' THEN 'done' ELSE 'superseded' END, NULL::bytea, NULL::double precision;
END
$$;

-- RevokeJobHandler: Apple answered 200 (or invalid_grant: already dead) for `p_token_enc`, as
-- siwa.revoke_step returned it for job p_job_id. Not fenced: the token is revoked at Apple
-- whoever holds the lease now, so it leaves the account (current or retired) and counts for the
-- deletion's reason. Returns whether the token was still stored.
CREATE OR REPLACE FUNCTION siwa.revoke_succeeded(p_job_id bigint, p_token_enc bytea) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    j siwa.jobs;
    removed integer;
BEGIN
    SELECT * INTO j FROM siwa.jobs WHERE id = p_job_id AND kind = 'revoke' FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE siwa.accounts
       SET refresh_token_enc = CASE WHEN refresh_token_enc = p_token_enc THEN NULL ELSE refresh_token_enc END,
           retired_tokens_enc = array_remove(retired_tokens_enc, p_token_enc), updated_at = now()
     WHERE client_id = j.client_id AND sub = j.sub
       AND (refresh_token_enc = p_token_enc OR p_token_enc = ANY (retired_tokens_enc));
    GET DIAGNOSTICS removed = ROW_COUNT;
    PERFORM siwa.count_token_revoked(p_job_id);
    RETURN removed > 0;
END
$$;

-- Whether an account is due for reconciliation, the one rule (the schedule, siwa.queue_reconciles,
-- and the job before it calls Apple, siwa.reconcile_token): NULL when due, else why not.
-- `skipped`: Apple's answer could not change it (siwa.account_effect's `reconcile_invalid_grant`
-- applies only to an active account: siwa.reconcile_result acts on the same rule), or it holds no
-- token to test; `checked_recently`: its token was checked with Apple in the last 24 hours.
-- Inlined by the planner (no SET clause, no relation named).
CREATE OR REPLACE FUNCTION siwa.reconcile_skip(p_status text, p_token_enc bytea, p_checked_at timestamptz)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN (siwa.account_effect(p_status, 'reconcile_invalid_grant')).outcome IS DISTINCT FROM 'applied'
                     OR p_token_enc IS NULL THEN 'skipped'
                WHEN p_checked_at >= now() - interval '24 hours' THEN 'checked_recently' END
$$;

-- ReconcileJobHandler, before it calls Apple: the token to test, or why the account is not
-- reconciled (siwa.reconcile_skip; `skipped` when there is no account). One row, always.
DROP FUNCTION IF EXISTS siwa.reconcile_account(text, text);  -- its predecessor left the rule to Swift
CREATE OR REPLACE FUNCTION siwa.reconcile_token(p_client_id text, p_sub text)
RETURNS TABLE (skipped text, refresh_token_enc bytea)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT d.skipped, CASE WHEN d.skipped IS NULL THEN d.refresh_token_enc END
      FROM (SELECT siwa.reconcile_skip(a.status, a.refresh_token_enc, a.token_checked_at) AS skipped, a.refresh_token_enc
              FROM (SELECT 1) AS one
              LEFT JOIN siwa.accounts a ON a.client_id = p_client_id AND a.sub = p_sub) d
$$;

-- ReconcileJobHandler: Apple's answer for the token it tested (`p_token_enc`, as read before the
-- call): `valid` or `invalid_grant`. Acts only if that token is still the stored one of an active
-- account (a relink meanwhile stored a fresh token that the answer says nothing about). Fenced by
-- the lease; completes the job. Returns the job's outcome, or NULL when the lease was lost.
CREATE OR REPLACE FUNCTION siwa.reconcile_result(
    p_job_id bigint, p_attempt integer, p_token_enc bytea, p_answer text
) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    j siwa.jobs;
    a siwa.accounts;
    effect siwa.account_effect;
    result_outcome text;
BEGIN
    SELECT * INTO j FROM siwa.jobs WHERE id = p_job_id AND state = 'running' AND attempt = p_attempt FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT * INTO a FROM siwa.accounts WHERE client_id = j.client_id AND sub = j.sub FOR UPDATE;
    -- Either answer is about an account invalid_grant would apply to (an active one), and its
    -- stored token.
    effect := siwa.account_effect(a.status, 'reconcile_invalid_grant');
    IF effect.outcome <> 'applied' OR a.refresh_token_enc IS DISTINCT FROM p_token_enc THEN
        result_outcome := 'superseded';
    ELSIF p_answer = 'valid' THEN
        UPDATE siwa.accounts SET token_checked_at = now() WHERE client_id = a.client_id AND sub = a.sub;
        result_outcome := 'token_valid';
    ELSIF p_answer = 'invalid_grant' THEN
        -- The tested token is dead (Apple says so); the older ones it kept are revoked, not dropped.
        IF effect.ends_grant THEN
            PERFORM siwa.revoke_token_later(a.client_id, a.sub, t, 'reconcile_invalid_grant')
               FROM unnest(a.retired_tokens_enc) AS t;
        END IF;
        PERFORM siwa.apply_account_effect(a.client_id, a.sub, effect, 'reconcile_invalid_grant', j.id, true);
        result_outcome := effect.change;
    ELSE
        RAISE EXCEPTION 'siwa.reconcile_result: unknown answer %', p_answer USING ERRCODE = '22023';
    END IF;
    PERFORM siwa.complete_job(j.id, p_attempt, result_outcome);
    RETURN result_outcome;
END
$$;

-- Its predecessor judged by timestamps (a deletion's start time), which is not commit order.
DROP FUNCTION IF EXISTS siwa.sign_in_succeeded(text, text, text, bytea, text, boolean, timestamptz);

-- The app API's sign-in (siwa.sign_in): a verified identity token for (p_client_id, p_sub), with
-- the token of the code it exchanged (sealed for the row) or NULL. The caller read the account's
-- `deletion_requests` (p_deletion_requests_seen) when it found no deletion pending, before its
-- exchange; any request counted since wins: the sign-in then keeps the token for that deletion
-- (pending), has it revoked (finished), or leaves it with a newer life, and the status stays. A
-- counter follows commit order whatever the transactions' start times, and it sees a repeated
-- request on a deleted account, which changes nothing else. Returns the status after it and whether
-- the account row is new.
CREATE OR REPLACE FUNCTION siwa.sign_in_succeeded(
    p_client_id text, p_sub text, p_app_user_id text, p_token_enc bytea, p_email text, p_is_private_email boolean,
    p_deletion_requests_seen bigint, OUT status text, OUT created boolean)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    deletion_after boolean;
    result record;
    effect siwa.account_effect;
BEGIN
    -- A first sign-in (no row): the row is written once, as siwa.account_linked would leave it
    -- after lock_account's insert (no deletion can have been requested for a row that did not
    -- exist, and it holds no token yet), instead of inserted and then updated. Half the heap and
    -- WAL writes of the sign-in that creates an account; any other case takes the general path.
    PERFORM 1 FROM siwa.accounts a WHERE a.client_id = p_client_id AND a.sub = p_sub FOR UPDATE;
    IF NOT FOUND THEN
        effect := siwa.account_effect(NULL, 'linked');
        IF effect.outcome = 'applied' THEN
            INSERT INTO siwa.accounts AS a (client_id, sub, status, app_user_id, email, is_private_email,
                                            refresh_token_enc, linked_at, token_checked_at, updated_at)
            VALUES (p_client_id, p_sub, effect.next_status, p_app_user_id, p_email, p_is_private_email, p_token_enc,
                    now(), CASE WHEN p_token_enc IS NOT NULL THEN now() END, now())
            ON CONFLICT (client_id, sub) DO NOTHING
            RETURNING true INTO created;
            IF created THEN
                PERFORM siwa.record_change(p_client_id, p_sub, effect.change, siwa.sign_in_reason(NULL, p_token_enc), NULL, NULL);
                status := effect.next_status;
                RETURN;
            END IF;
        END IF;
    END IF;
    -- The count is judged under the account's lock, so no request can slip in before the write.
    created := siwa.lock_account(p_client_id, p_sub, 'active');
    SELECT a.deletion_requests > coalesce(p_deletion_requests_seen, 0) INTO deletion_after
      FROM siwa.accounts a WHERE a.client_id = p_client_id AND a.sub = p_sub;
    -- An assignment, not SELECT ... FROM: PL/pgSQL evaluates the call as a simple expression.
    result := siwa.account_linked(p_client_id, p_sub, p_app_user_id, p_token_enc, p_email, p_is_private_email,
                                  false, deletion_after, NULL);
    status := result.result_status;
    created := created OR result.result_created;
END
$$;

-- What the client was told about the user once, stored by the app API's sign-in (siwa.sign_in,
-- app_api.sql) when it leaves the account active: p_full_name (an object; NULL keeps the stored
-- one) and p_real_user_status (NULL: kept). Answers siwa.account's columns, read back from the
-- write (plpgsql: a plan cached for the session, as siwa.sign_in's own read).
CREATE OR REPLACE FUNCTION siwa.account_profile_signed_in(
    p_client_id text, p_sub text, p_full_name jsonb, p_real_user_status text
) RETURNS TABLE (
    client_id text, sub text, app_user_id text, status text, email text, is_private_email boolean,
    email_forwarding text, sessions_revoked_at timestamptz, linked_at timestamptz, updated_at timestamptz,
    has_refresh_token boolean, full_name jsonb, real_user_status text
)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
        UPDATE siwa.accounts a
           SET full_name = coalesce(p_full_name, a.full_name),
               real_user_status = coalesce(p_real_user_status, a.real_user_status)
         WHERE a.client_id = p_client_id AND a.sub = p_sub
        RETURNING a.client_id, a.sub, a.app_user_id, a.status, a.email, a.is_private_email, a.email_forwarding,
                  a.sessions_revoked_at, a.linked_at, a.updated_at, a.refresh_token_enc IS NOT NULL, a.full_name,
                  a.real_user_status;
END
$$;

-- Sets the app's own user id on an account; false when there is no such account.
CREATE OR REPLACE FUNCTION siwa.set_app_user_id(p_client_id text, p_sub text, p_app_user_id text) RETURNS boolean
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    WITH updated AS (
        UPDATE siwa.accounts SET app_user_id = p_app_user_id, updated_at = now()
         WHERE client_id = p_client_id AND sub = p_sub
        RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM updated);
$$;

-- Team transfer's account write (siwa.complete_transfer, transfer.sql, decides when): a completed
-- import line makes (p_client_id, p_sub) the user's account with the line's app_user_id, as
-- p_effect (siwa.account_effect's `transferred`) says. p_target_exists: the account exists under
-- the new sub already, and keeps its status (Apple told us about it after the transfer: newer than
-- the line); else p_source_sub: the sending side's account in this database, re-keyed to the new
-- sub; else a new account, with no refresh token.
CREATE OR REPLACE FUNCTION siwa.account_transferred(
    p_client_id text, p_sub text, p_target_exists boolean, p_source_sub text, p_app_user_id text,
    p_email text, p_is_private_email boolean, p_effect siwa.account_effect
) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_target_exists THEN
        UPDATE siwa.accounts a
           SET app_user_id = p_app_user_id, email = coalesce(p_email, a.email),
               is_private_email = coalesce(p_is_private_email, a.is_private_email), updated_at = now()
         WHERE a.client_id = p_client_id AND a.sub = p_sub;
    ELSIF p_source_sub IS NOT NULL THEN
        -- Stored tokens are sealed with the old `sub` as associated data and belong to the old
        -- team: neither the new team nor the new key can use them, so they go
        -- (deploy/README.md, "Moving an app to another team").
        UPDATE siwa.accounts a
           SET sub = p_sub, app_user_id = p_app_user_id, status = p_effect.next_status,
               email = p_email, is_private_email = p_is_private_email, email_forwarding = NULL,
               refresh_token_enc = CASE WHEN p_effect.ends_grant THEN NULL ELSE a.refresh_token_enc END,
               retired_tokens_enc = CASE WHEN p_effect.ends_grant THEN '{}' ELSE a.retired_tokens_enc END,
               last_email_event_at = NULL,
               token_checked_at = NULL, linked_at = now(), updated_at = now(),
               transfer_sub = NULL, transfer_target_team = NULL, transfer_sub_at = NULL
         WHERE a.client_id = p_client_id AND a.sub = p_source_sub;
    ELSE
        INSERT INTO siwa.accounts (client_id, sub, app_user_id, status, email, is_private_email, linked_at, updated_at)
        VALUES (p_client_id, p_sub, p_app_user_id, p_effect.next_status, p_email,
                p_is_private_email, now(), now());
    END IF;
END
$$;

-- Stores the identifier Apple gave for (p_client_id, p_sub) and p_target_team; p_transfer_sub NULL
-- forgets it (one the file cannot carry: the next run asks again).
CREATE OR REPLACE FUNCTION siwa.transfer_export_store(p_client_id text, p_sub text, p_transfer_sub text, p_target_team text)
RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    UPDATE siwa.accounts a
       SET transfer_sub = p_transfer_sub,
           transfer_target_team = CASE WHEN p_transfer_sub IS NULL THEN a.transfer_target_team ELSE p_target_team END,
           transfer_sub_at = CASE WHEN p_transfer_sub IS NULL THEN a.transfer_sub_at ELSE now() END
     WHERE a.client_id = p_client_id AND a.sub = p_sub
$$;

-- Replaces token p_stored (current or retired) of the account with p_sealed, the same token sealed
-- with the current key. Returns whether it was still stored (1) or not (0).
CREATE OR REPLACE FUNCTION siwa.reseal_token(p_client_id text, p_sub text, p_stored bytea, p_sealed bytea)
RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    changed integer;
BEGIN
    UPDATE siwa.accounts a
       SET refresh_token_enc = CASE WHEN a.refresh_token_enc = p_stored THEN p_sealed ELSE a.refresh_token_enc END,
           retired_tokens_enc = array_replace(a.retired_tokens_enc, p_stored, p_sealed)
     WHERE a.client_id = p_client_id AND a.sub = p_sub
       AND (a.refresh_token_enc = p_stored OR p_stored = ANY (a.retired_tokens_enc));
    GET DIAGNOSTICS changed = ROW_COUNT;
    RETURN changed;
END
$$;

-- Personal data does not outlive its purpose: once an account is deleted (by the app or at Apple),
-- its notifications keep only what recognises a redelivery (jti) and what happened (type, time)
-- (siwa.erase_notifications, notifications.sql), and the account its identity, email and name.
CREATE OR REPLACE FUNCTION siwa.erase_personal_data(p_client_id text, p_sub text) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    SELECT siwa.erase_notifications(p_client_id, p_sub);
    -- The app_user_id too: a deleted account forgets who it was (its change rows, written before
    -- this, still say whom the app should delete).
    UPDATE siwa.accounts SET email = NULL, is_private_email = NULL, full_name = NULL, real_user_status = NULL,
                             app_user_id = NULL
     WHERE client_id = p_client_id AND sub = p_sub
       AND (email IS NOT NULL OR full_name IS NOT NULL OR real_user_status IS NOT NULL OR app_user_id IS NOT NULL);
$$;

-- App-facing: queue the exchange of a fresh authorization code (codes live five minutes, single
-- use). Runs first in the queue. The worker removes the code from the row once it is used.
-- A pending deletion blocks it (SQLSTATE 55000): the deletion would revoke what it links.
CREATE OR REPLACE FUNCTION siwa.link_account(client_id text, sub text, app_user_id text, authorization_code text)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    current_status text;
BEGIN
    IF coalesce(client_id, '') = '' OR coalesce(sub, '') = '' OR coalesce(authorization_code, '') = '' THEN
        RAISE EXCEPTION 'siwa.link_account: client_id, sub and authorization_code are required'
            USING ERRCODE = '22023';
    END IF;
    -- FOR SHARE: a deletion requested concurrently waits for this link to commit, so its revoke
    -- sees (and waits for) the exchange queued here.
    SELECT a.status INTO current_status FROM siwa.accounts a
     WHERE a.client_id = link_account.client_id AND a.sub = link_account.sub FOR SHARE;
    IF siwa.deletion_blocks_link(current_status, link_account.client_id, link_account.sub) THEN
        RAISE EXCEPTION 'siwa.link_account: deletion pending for this account; link again once it is deleted'
            USING ERRCODE = '55000';
    END IF;
    RETURN siwa.queue_exchange(link_account.client_id, link_account.sub,
                               jsonb_build_object('app_user_id', link_account.app_user_id, 'code', authorization_code));
END
$$;

-- App-facing: the deletion of a user, under every client ID of the group (SIWA_APP_GROUPS) where
-- the user has an account not yet deleted: each goes through siwa.request_deletion_one (its own
-- revoke job with its own client ID, its own change rows), in the group's fixed client ID order so
-- two deletions requested under two members cannot deadlock. The code, if any, is the requested
-- client ID's (a code is issued for one client ID); the answer is that client ID's job.
CREATE OR REPLACE FUNCTION siwa.request_deletion(client_id text, sub text, authorization_code text)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    member text;
    requested bigint;
BEGIN
    IF coalesce(client_id, '') = '' OR coalesce(sub, '') = '' THEN
        RAISE EXCEPTION 'siwa.request_deletion: client_id and sub are required' USING ERRCODE = '22023';
    END IF;
    FOR member IN SELECT siwa.group_client_ids(request_deletion.client_id) LOOP
        IF member = request_deletion.client_id THEN
            requested := siwa.request_deletion_one(member, request_deletion.sub, authorization_code);
        -- An account there not yet deleted, or a link queued there (its exchange may not have
        -- created the row yet): a deletion is never undone by work queued before it.
        ELSIF EXISTS (SELECT 1 FROM siwa.accounts a
                       WHERE a.client_id = member AND a.sub = request_deletion.sub AND a.status <> 'deleted')
           OR EXISTS (SELECT 1 FROM siwa.jobs e
                       WHERE e.client_id = member AND e.sub = request_deletion.sub AND e.kind = 'exchange'
                         AND e.state IN ('available', 'running')) THEN
            PERFORM siwa.request_deletion_one(member, request_deletion.sub, NULL);
        END IF;
    END LOOP;
    RETURN requested;
END
$$;

-- Marks one account for deletion and queues the revoke at Apple. With a code (an account
-- with no stored token, e.g. linked before this system), the code is exchanged first and the token
-- it yields is revoked with any stored one. Calling it again returns the same job while that
-- deletion is pending or done (a code given again is exchanged while it is pending), unless a link
-- was queued after it finished: then that link is deleted too, by a new job.
CREATE OR REPLACE FUNCTION siwa.request_deletion_one(client_id text, sub text, authorization_code text)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    a siwa.accounts;
    job_id bigint;
    exchange_id bigint;
BEGIN
    PERFORM siwa.lock_account(request_deletion_one.client_id, request_deletion_one.sub, 'pending_deletion');
    -- Counted on every call, a repeat included: a sign-in in flight reads the count (see
    -- siwa.sign_in_succeeded) and must lose to any request made after its read.
    UPDATE siwa.accounts SET deletion_requests = accounts.deletion_requests + 1
     WHERE accounts.client_id = request_deletion_one.client_id AND accounts.sub = request_deletion_one.sub
    RETURNING * INTO a;

    IF a.status IN ('pending_deletion', 'deleted') THEN
        SELECT j.id INTO job_id FROM siwa.jobs j
         WHERE j.client_id = a.client_id AND j.sub = a.sub AND j.kind = 'revoke' AND j.state <> 'cancelled'
           AND NOT j.args ? 'late_token'
         ORDER BY j.id DESC LIMIT 1;
        -- A finished deletion with a link queued since is a new life on its way: delete it anew.
        IF a.status = 'deleted' AND EXISTS (
            SELECT 1 FROM siwa.jobs e
             WHERE e.client_id = a.client_id AND e.sub = a.sub AND e.kind = 'exchange'
               AND e.state IN ('available', 'running') AND e.id > job_id) THEN
            job_id := NULL;
        END IF;
    END IF;
    -- A code on a finished deletion comes from a sign-in since (the user authorized the app
    -- again): exchanged for the deletion, its token is revoked by a late revoke (siwa.account_linked);
    -- the exchange's job is the one answered.
    IF coalesce(authorization_code, '') <> '' AND (job_id IS NULL OR a.status IN ('pending_deletion', 'deleted')) THEN
        exchange_id := siwa.queue_exchange(a.client_id, a.sub,
                                           jsonb_build_object('code', authorization_code, 'purpose', 'deletion'));
        IF job_id IS NOT NULL AND a.status = 'deleted' THEN
            RETURN exchange_id;
        END IF;
    END IF;
    IF job_id IS NOT NULL THEN
        RETURN job_id;
    END IF;

    -- A pending deletion is never dropped: revoke jobs retry for as long as it takes.
    job_id := siwa.queue_revoke(a.client_id, a.sub, '{}');
    PERFORM siwa.apply_account_effect(a.client_id, a.sub, siwa.account_effect(a.status, 'deletion_requested'),
                                      NULL, job_id, false);
    RETURN job_id;
END
$$;

-- The contract's `authorization_code text DEFAULT NULL`, as an overload: a default on the
-- three-argument function would make every two-argument call ambiguous with this one, which stays
-- because migration 003 (shipped, re-run when roles appear later) names it and existing callers
-- and grants use it.
CREATE OR REPLACE FUNCTION siwa.request_deletion(client_id text, sub text) RETURNS bigint
LANGUAGE sql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
    SELECT siwa.request_deletion($1, $2, NULL::text)
$$;

-- App-facing: the account without its tokens; no row when unknown.
CREATE OR REPLACE FUNCTION siwa.account(client_id text, sub text) RETURNS SETOF siwa.account_view
LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
    SELECT a.client_id, a.sub, a.app_user_id, a.status, a.email, a.is_private_email, a.email_forwarding,
           a.sessions_revoked_at, a.linked_at, a.updated_at, a.refresh_token_enc IS NOT NULL, a.full_name,
           a.real_user_status
      FROM siwa.accounts a
     WHERE a.client_id = $1 AND a.sub = $2
$$;

-- The operator console (`siwa console`) shows an account as the app sees it: siwa.account's row
-- (the same function, so the console and the app API cannot show one row differently), and with
-- it these two. How many earlier refresh tokens the account keeps for a deletion to revoke: a
-- count, never their bytes; NULL when there is no account.
CREATE OR REPLACE FUNCTION siwa.retired_token_count(p_client_id text, p_sub text) RETURNS integer
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(cardinality(a.retired_tokens_enc), 0) FROM siwa.accounts a
     WHERE a.client_id = p_client_id AND a.sub = p_sub
$$;

-- The console's start (`siwa console`): fails unless the login may read what the console shows
-- (the queue and the accounts) and the database is migrated. SECURITY INVOKER, so the caller's
-- own privileges are the ones checked. The result says nothing.
CREATE OR REPLACE FUNCTION siwa.console_can_read() RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT true FROM siwa.jobs, siwa.accounts LIMIT 1
$$;

-- The accounts whose sub or app_user_id is exactly p_text, most recently changed first, at most
-- p_limit: the console's search, which shows each through siwa.account.
CREATE OR REPLACE FUNCTION siwa.find_accounts(p_text text, p_limit integer) RETURNS TABLE (client_id text, sub text)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT a.client_id, a.sub FROM siwa.accounts a
     WHERE a.sub = p_text OR a.app_user_id = p_text
     ORDER BY a.updated_at DESC
     LIMIT p_limit
$$;

-- Whether a job of this kind for this account holds up a pending deletion: a revoke of an account
-- still `pending_deletion` (`siwa jobs cancel` refuses it without --force; `siwa status` counts
-- those discarded as process_died).
CREATE OR REPLACE FUNCTION siwa.guards_pending_deletion(p_kind text, p_client_id text, p_sub text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT p_kind = 'revoke' AND EXISTS (
        SELECT 1 FROM siwa.accounts a
         WHERE a.client_id = p_client_id AND a.sub = p_sub AND a.status = 'pending_deletion')
$$;

-- The accounts waiting on a deletion, oldest first, with each one's age: a deletion is as old as
-- its revoke job (the account row's updated_at moves on later events; it stands in when no revoke
-- was queued). The console's overview lists them; siwa.deletion_backlog names the oldest.
CREATE OR REPLACE FUNCTION siwa.pending_deletions() RETURNS TABLE (client_id text, sub text, age_seconds double precision)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT a.client_id, a.sub,
           extract(epoch FROM now() - coalesce(
               (SELECT min(j.created_at) FROM siwa.jobs j
                 WHERE j.kind = 'revoke' AND j.client_id = a.client_id AND j.sub = a.sub
                   AND j.state <> 'cancelled'),
               a.updated_at))::float8 AS age
      FROM siwa.accounts a
     WHERE a.status = 'pending_deletion'
     ORDER BY age DESC
$$;

-- The deletions still waiting, for `siwa status`: how many accounts are `pending_deletion`, the
-- oldest one and its age (siwa.pending_deletions), and how many wait on a revoke discarded as
-- `process_died` (its process died running it three times, siwa.rescue_expired_jobs: `siwa jobs
-- retry` runs it again).
CREATE OR REPLACE FUNCTION siwa.deletion_backlog(
    OUT pending bigint, OUT oldest_client_id text, OUT oldest_sub text, OUT oldest_seconds double precision,
    OUT process_died_revokes bigint
) LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT (SELECT count(*) FROM siwa.accounts WHERE status = 'pending_deletion'),
           o.client_id, o.sub, o.age_seconds,
           (SELECT count(*) FROM siwa.jobs j
             WHERE j.state = 'discarded' AND j.errors -> -1 ->> 'error' = 'process_died'
               AND siwa.guards_pending_deletion(j.kind, j.client_id, j.sub))
      FROM (SELECT 1) one
      LEFT JOIN LATERAL (SELECT d.client_id, d.sub, d.age_seconds FROM siwa.pending_deletions() d
                          ORDER BY d.age_seconds DESC LIMIT 1) o ON true
$$;

-- Retention of the change feed (the worker's pass, SIWA_RETENTION_DAYS): change rows older than
-- p_age_seconds, at most p_batch, except those whose webhook delivery is still owed (queued, in
-- flight, or discarded and waiting for `siwa jobs retry`): pruning them would turn the delivery
-- into a lost change. Returns how many it deleted.
CREATE OR REPLACE FUNCTION siwa.prune_account_changes(p_age_seconds double precision, p_batch integer)
RETURNS integer
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    WITH pruned AS (
        DELETE FROM siwa.account_changes WHERE id IN (
            SELECT c.id FROM siwa.account_changes c
             WHERE c.created_at < now() - make_interval(secs => p_age_seconds)
               AND NOT EXISTS (
                   SELECT 1 FROM siwa.jobs j
                    WHERE j.kind = 'webhook' AND j.state IN ('available', 'running', 'discarded')
                      AND j.client_id = c.client_id AND j.sub = c.sub
                      AND (j.args->>'change_id')::bigint = c.id)
             LIMIT p_batch)
        RETURNING 1
    )
    SELECT count(*)::integer FROM pruned
$$;

-- Privileges: the app calls the app-facing functions; the worker everything here, and so does the
-- console, which runs with a siwa_worker login (see jobs.sql on PUBLIC).
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA siwa FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_worker') THEN
        GRANT EXECUTE ON FUNCTION
            siwa.account_effect(text, text),
            siwa.record_change(text, text, text, text, text, bigint),
            siwa.record_changes(text[], text[], text[], text[], text[], text[], text[], bigint[]),
            siwa.apply_account_effect(text, text, siwa.account_effect, text, bigint, boolean),
            siwa.change_payload(bigint, text, text, text, text), siwa.lock_account(text, text, text),
            siwa.account_linked(text, text, text, bytea, text, boolean, boolean, boolean, bigint),
            siwa.account_imported(text, text, text, bytea),
            siwa.exchange_succeeded(bigint, bytea, text, boolean), siwa.exchange_failed(bigint, integer, text),
            siwa.revoke_step(bigint, integer), siwa.revoke_succeeded(bigint, bytea),
            siwa.reconcile_skip(text, bytea, timestamptz), siwa.reconcile_token(text, text),
            siwa.reconcile_result(bigint, integer, bytea, text),
            siwa.sign_in_succeeded(text, text, text, bytea, text, boolean, bigint), siwa.sign_in_reason(bigint, bytea),
            siwa.link_account(text, text, text, text), siwa.request_deletion(text, text, text),
            siwa.request_deletion_one(text, text, text), siwa.request_deletion(text, text), siwa.account(text, text),
            siwa.group_client_ids(text),
            siwa.group_deletion_pending(text, text), siwa.deletion_blocks_link(text, text, text),
            siwa.apple_event_known(text), siwa.email_event(text), siwa.ignores_email_events(text),
            siwa.retired_token_count(text, text), siwa.find_accounts(text, integer), siwa.console_can_read(),
            siwa.guards_pending_deletion(text, text, text), siwa.pending_deletions(),
            siwa.deletion_backlog(),
            siwa.prune_account_changes(double precision, integer),
            siwa.account_profile_signed_in(text, text, jsonb, text), siwa.set_app_user_id(text, text, text),
            siwa.account_transferred(text, text, boolean, text, text, text, boolean, siwa.account_effect),
            siwa.transfer_export_store(text, text, text, text), siwa.reseal_token(text, text, bytea, bytea),
            siwa.erase_personal_data(text, text)
           TO siwa_worker;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_app') THEN
        GRANT EXECUTE ON FUNCTION siwa.link_account(text, text, text, text), siwa.request_deletion(text, text, text),
                                  siwa.request_deletion(text, text), siwa.account(text, text)
           TO siwa_app;
    END IF;
END
$$;
