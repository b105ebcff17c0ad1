-- Functions of the app API (siwa-worker, SIWA_APP_API_LISTEN). The worker's own role calls them;
-- none is granted to siwa_app (apps that share the database call siwa.link_account and friends).

-- Stores a new nonce (by its SHA-256) valid for p_ttl; returns when it expires.
CREATE OR REPLACE FUNCTION siwa.issue_nonce(p_nonce_hash bytea, p_ttl interval) RETURNS timestamptz
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO siwa.sign_in_nonces (nonce_hash, expires_at) VALUES (p_nonce_hash, now() + p_ttl)
    RETURNING expires_at;
$$;

-- Spends a nonce: true when it existed and had not expired. One DELETE ... RETURNING, so of any
-- number of concurrent callers with the same nonce at most one gets true; an expired row found
-- here is deleted as well (spent either way).
CREATE OR REPLACE FUNCTION siwa.consume_nonce(p_nonce_hash bytea) RETURNS boolean
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    WITH consumed AS (
        DELETE FROM siwa.sign_in_nonces WHERE nonce_hash = p_nonce_hash RETURNING expires_at > now() AS valid)
    SELECT coalesce((SELECT valid FROM consumed), false);
$$;

-- Deletes up to p_limit expired nonces; returns how many.
CREATE OR REPLACE FUNCTION siwa.prune_nonces(p_limit integer) RETURNS integer
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    WITH pruned AS (
        DELETE FROM siwa.sign_in_nonces
         WHERE nonce_hash IN (SELECT nonce_hash FROM siwa.sign_in_nonces WHERE expires_at <= now()
                               ORDER BY expires_at LIMIT p_limit)
        RETURNING 1)
    SELECT count(*)::integer FROM pruned;
$$;

-- The account effect of a verified sign-in, in one place (the account state machine's sign-in
-- event): the account for (client_id, sub) is active afterwards, with the token's email and, when
-- the sign-in exchanged a code, the new refresh token (already encrypted by the worker).
--   * no row: created active (new = true), change `linked`;
--   * pending_deletion: SQLSTATE 55000 `deletion pending` (the API answers 403), nothing changes;
--   * deleted, apple_account_deleted: a new life: active, linked now, app_user_id cleared (it
--     belonged to the user whose data the app deleted), change `linked`;
--   * consent_revoked: active again with the same app_user_id, change `linked`;
--   * active: email refreshed; a token is stored only when none was (change `linked` then).
-- Row lock waits are bounded (lock_timeout), so a sign-in never hangs behind a stuck transaction.
CREATE OR REPLACE FUNCTION siwa.sign_in(
    p_client_id text, p_sub text, p_email text, p_is_private_email boolean, p_refresh_token_enc bytea
) RETURNS TABLE (
    client_id text, sub text, app_user_id text, status text, email text, is_private_email boolean,
    email_forwarding text, sessions_revoked_at timestamptz, linked_at timestamptz, updated_at timestamptz,
    has_refresh_token boolean, is_new boolean
)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '5s'
AS $$
#variable_conflict use_column
DECLARE
    previous siwa.accounts;
    result siwa.accounts;
    created boolean := false;
BEGIN
    IF coalesce(p_client_id, '') = '' OR coalesce(p_sub, '') = '' THEN
        RAISE EXCEPTION 'siwa.sign_in: client_id and sub are required' USING ERRCODE = '22023';
    END IF;
    INSERT INTO siwa.accounts AS a (client_id, sub, status, email, is_private_email, refresh_token_enc, linked_at,
                                    token_checked_at, updated_at)
    VALUES (p_client_id, p_sub, 'active', p_email, p_is_private_email, p_refresh_token_enc, now(),
            CASE WHEN p_refresh_token_enc IS NOT NULL THEN now() END, now())
    ON CONFLICT DO NOTHING
    RETURNING * INTO result;
    created := FOUND;

    IF NOT created THEN
        SELECT * INTO previous FROM siwa.accounts a WHERE a.client_id = p_client_id AND a.sub = p_sub FOR UPDATE;
        IF previous.status = 'pending_deletion' THEN
            RAISE EXCEPTION 'siwa.sign_in: deletion pending for this account' USING ERRCODE = '55000';
        END IF;
        UPDATE siwa.accounts a
           SET status = 'active',
               app_user_id = CASE WHEN previous.status IN ('deleted', 'apple_account_deleted') THEN NULL
                                  ELSE a.app_user_id END,
               email = coalesce(p_email, a.email),
               is_private_email = coalesce(p_is_private_email, a.is_private_email),
               refresh_token_enc = coalesce(a.refresh_token_enc, p_refresh_token_enc),
               linked_at = CASE WHEN previous.status <> 'active'
                                  OR (a.refresh_token_enc IS NULL AND p_refresh_token_enc IS NOT NULL)
                                THEN now() ELSE a.linked_at END,
               token_checked_at = CASE WHEN a.refresh_token_enc IS NULL AND p_refresh_token_enc IS NOT NULL
                                       THEN now() ELSE a.token_checked_at END,
               updated_at = now()
         WHERE a.client_id = p_client_id AND a.sub = p_sub
        RETURNING * INTO result;
    END IF;

    IF created OR previous.status <> 'active'
       OR (previous.refresh_token_enc IS NULL AND result.refresh_token_enc IS NOT NULL) THEN
        PERFORM siwa.record_change(p_client_id, p_sub, 'linked', 'sign_in', NULL, NULL);
    END IF;

    RETURN QUERY SELECT result.client_id, result.sub, result.app_user_id, result.status, result.email,
                        result.is_private_email, result.email_forwarding, result.sessions_revoked_at, result.linked_at,
                        result.updated_at, result.refresh_token_enc IS NOT NULL, created;
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

-- Privileges: the worker (which serves the app API) calls these; nobody else.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA siwa FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_worker') THEN
        GRANT EXECUTE ON FUNCTION siwa.issue_nonce(bytea, interval), siwa.consume_nonce(bytea),
                                  siwa.prune_nonces(integer), siwa.sign_in(text, text, text, boolean, bytea),
                                  siwa.set_app_user_id(text, text, text)
           TO siwa_worker;
    END IF;
END
$$;
