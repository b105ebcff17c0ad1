-- Team transfer, recipient side: a recorded `transfer_sub,app_user_id` line becomes the account of
-- the user's new `sub`. One rule for both ways a line completes: the import's exchange at Apple
-- (`siwa accounts transfer import`) and a sign-in whose identity token carries `transfer_sub`.
-- Tables: sql/009_team_transfer.sql.

-- Completes a pending line: the account `(client_id, sub)` gets the line's app_user_id and the new
-- email; it is created with no refresh token (the old team's tokens are useless to the new one),
-- or, when this database also holds the sending side's account (found by the transfer_sub the
-- export stored on it), that account is re-keyed to the new `sub`, its old token dropped: both as
-- event `transferred` of siwa.account_effect says (`active`, the grant ended for this team). An account that already exists under the new `sub` keeps its status (Apple told us about
-- it after the transfer: newer than the line). A line whose account is being deleted or was deleted
-- is `skipped`, never brought back. Appends change `transferred` (reason: how it completed).
-- Returns the app_user_id the account now carries; the same for a line already completed with this
-- `sub` (idempotent, no new change); NULL when no line matches or the line was skipped.
CREATE OR REPLACE FUNCTION siwa.complete_transfer(
    p_client_id text, p_transfer_sub text, p_sub text, p_email text, p_is_private_email boolean, p_via text
) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    line   siwa.transfer_imports;
    target siwa.accounts;
    source siwa.accounts;
    effect siwa.account_effect;
BEGIN
    IF coalesce(p_client_id, '') = '' OR coalesce(p_transfer_sub, '') = '' OR coalesce(p_sub, '') = ''
       OR p_via IS NULL OR p_via NOT IN ('import', 'sign_in') THEN
        RAISE EXCEPTION 'siwa.complete_transfer: client_id, transfer_sub, sub and via (import or sign_in) are required'
            USING ERRCODE = '22023';
    END IF;
    SELECT * INTO line FROM siwa.transfer_imports t
     WHERE t.client_id = p_client_id AND t.transfer_sub = p_transfer_sub FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF line.state <> 'pending' THEN
        RETURN CASE WHEN line.state = 'done' AND line.sub = p_sub THEN line.app_user_id END;
    END IF;

    SELECT * INTO target FROM siwa.accounts a WHERE a.client_id = p_client_id AND a.sub = p_sub FOR UPDATE;
    IF NOT FOUND THEN
        SELECT * INTO source FROM siwa.accounts a
         WHERE a.client_id = p_client_id AND a.transfer_sub = p_transfer_sub
         ORDER BY a.sub LIMIT 1 FOR UPDATE;
    END IF;

    -- No account at all: the line creates one (status NULL).
    effect := siwa.account_effect(coalesce(target.status, source.status), 'transferred');
    IF effect.outcome <> 'applied' THEN
        UPDATE siwa.transfer_imports t
           SET state = 'skipped', sub = p_sub, completed_by = p_via, completed_at = now(),
               last_error = 'account_' || coalesce(target.status, source.status)
         WHERE t.client_id = p_client_id AND t.transfer_sub = p_transfer_sub;
        RETURN NULL;
    END IF;

    PERFORM siwa.account_transferred(p_client_id, p_sub, target.sub IS NOT NULL, source.sub, line.app_user_id,
                                     p_email, p_is_private_email, effect);

    UPDATE siwa.transfer_imports t
       SET state = 'done', sub = p_sub, completed_by = p_via, completed_at = now(), last_error = NULL
     WHERE t.client_id = p_client_id AND t.transfer_sub = p_transfer_sub;
    PERFORM siwa.record_change(p_client_id, p_sub, effect.change, p_via, NULL, NULL);
    RETURN line.app_user_id;
END
$$;

-- The app API's sign-in: an identity token carrying `transfer_sub` completes its imported line at
-- once, even before the import's exchange reached it. Returns the app_user_id the account
-- `(client_id, sub)` now carries, or NULL when no imported line matches (an ordinary sign-in).
-- Call it in the sign-in's transaction after the token is verified: the `sub` it is given is
-- taken as proven, so only the worker (which checks Apple's signature first) may call it.
CREATE OR REPLACE FUNCTION siwa.claim_transfer(
    client_id text, transfer_sub text, sub text, email text, is_private_email boolean
) RETURNS text
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT siwa.complete_transfer(client_id, transfer_sub, sub, email, is_private_email, 'sign_in')
$$;

-- Team transfer, sending side (`siwa accounts transfer export`, WorkerCore/Transfer/TransferExport.swift):
-- the accounts the file carries are the active ones with an app_user_id (the recipient maps each
-- line to that); each gets the `transfer_sub` Apple gives for the target team, stored as it arrives.

-- The client IDs with accounts to export.
CREATE OR REPLACE FUNCTION siwa.transfer_export_client_ids() RETURNS SETOF text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT DISTINCT a.client_id FROM siwa.accounts a
     WHERE a.status = 'active' AND a.app_user_id IS NOT NULL ORDER BY a.client_id
$$;

-- What an export of p_client_id to p_target_team finds: one row `exported` (every account the file
-- carries) and `obtained` (those with an identifier for that team already), then one row per reason
-- an account is left out (its status, or `no_app_user_id`) with how many.
CREATE OR REPLACE FUNCTION siwa.transfer_export_counts(p_client_id text, p_target_team text)
RETURNS TABLE (what text, n bigint)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT 'exported', count(*) FROM siwa.accounts a
     WHERE a.client_id = p_client_id AND a.status = 'active' AND a.app_user_id IS NOT NULL
    UNION ALL
    SELECT 'obtained', count(*) FROM siwa.accounts a
     WHERE a.client_id = p_client_id AND a.status = 'active' AND a.app_user_id IS NOT NULL
       AND a.transfer_sub IS NOT NULL AND a.transfer_target_team = p_target_team
    UNION ALL
    SELECT * FROM (SELECT CASE WHEN a.status = 'active' THEN 'no_app_user_id' ELSE a.status END, count(*)
                     FROM siwa.accounts a
                    WHERE a.client_id = p_client_id AND NOT (a.status = 'active' AND a.app_user_id IS NOT NULL)
                    GROUP BY 1) skipped
$$;

-- The next p_limit exported subs after p_after, in order, still without an identifier for p_target_team.
CREATE OR REPLACE FUNCTION siwa.transfer_export_missing(p_client_id text, p_target_team text, p_after text, p_limit integer)
RETURNS SETOF text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT a.sub FROM siwa.accounts a
     WHERE a.client_id = p_client_id AND a.status = 'active' AND a.app_user_id IS NOT NULL
       AND (a.transfer_sub IS NULL OR a.transfer_target_team IS DISTINCT FROM p_target_team)
       AND a.sub > p_after
     ORDER BY a.sub LIMIT p_limit
$$;

-- The file's next p_limit records after p_after: every exported account with an identifier for p_target_team.
CREATE OR REPLACE FUNCTION siwa.transfer_export_records(p_client_id text, p_target_team text, p_after text, p_limit integer)
RETURNS TABLE (sub text, transfer_sub text, app_user_id text)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT a.sub, a.transfer_sub, a.app_user_id FROM siwa.accounts a
     WHERE a.client_id = p_client_id AND a.status = 'active' AND a.app_user_id IS NOT NULL
       AND a.transfer_sub IS NOT NULL AND a.transfer_target_team = p_target_team AND a.sub > p_after
     ORDER BY a.sub LIMIT p_limit
$$;

-- `siwa transfer import`: records a batch of the file's lines (p_transfer_subs[i] maps to
-- p_app_user_ids[i]) as pending imports; a line recorded before is left as it is. Returns the lines
-- of the batch that were recorded before, with the app_user_id they were recorded with, so the
-- caller tells a line read twice from a conflicting one (same transfer_sub, another app_user_id).
CREATE OR REPLACE FUNCTION siwa.record_transfer_lines(p_client_id text, p_transfer_subs text[], p_app_user_ids text[])
RETURNS TABLE (transfer_sub text, app_user_id text)
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    -- Both parts see the table as it was before the statement: `recorded` is what was there.
    WITH recorded AS (
        SELECT t.transfer_sub, t.app_user_id FROM siwa.transfer_imports t
         WHERE t.client_id = p_client_id AND t.transfer_sub = ANY (p_transfer_subs)),
    added AS (
        INSERT INTO siwa.transfer_imports (client_id, transfer_sub, app_user_id)
        SELECT p_client_id, line.transfer_sub, line.app_user_id
          FROM unnest(p_transfer_subs, p_app_user_ids) AS line(transfer_sub, app_user_id)
        ON CONFLICT (client_id, transfer_sub) DO NOTHING
        RETURNING 1)
    SELECT recorded.transfer_sub, recorded.app_user_id FROM recorded
$$;

-- Apple's migration call failed for a pending line: counted, and why, for the next run's report.
CREATE OR REPLACE FUNCTION siwa.transfer_import_failed(p_client_id text, p_transfer_sub text, p_reason text)
RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    UPDATE siwa.transfer_imports SET attempts = attempts + 1, last_error = p_reason
     WHERE client_id = p_client_id AND transfer_sub = p_transfer_sub AND state = 'pending'
$$;

-- Privileges: the worker only (app API, and operators running the transfer commands with its
-- login); siwa_app nothing, it has no proof from Apple to offer (sql/017); PUBLIC nothing (see jobs.sql).
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA siwa FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_worker') THEN
        GRANT EXECUTE ON FUNCTION siwa.complete_transfer(text, text, text, text, boolean, text),
                                  siwa.claim_transfer(text, text, text, text, boolean),
                                  siwa.transfer_export_client_ids(), siwa.transfer_export_counts(text, text),
                                  siwa.transfer_export_missing(text, text, text, integer),
                                  siwa.transfer_export_records(text, text, text, integer),
                                  siwa.record_transfer_lines(text, text[], text[]),
                                  siwa.transfer_import_failed(text, text, text)
           TO siwa_worker;
    END IF;
END
$$;
