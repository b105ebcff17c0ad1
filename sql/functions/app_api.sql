-- Functions of the app API (siwa-worker, SIWA_APP_API_LISTEN). The worker's own role calls them;
-- only the change feed is granted to siwa_app as well (apps that share the database call
-- siwa.link_account and friends, and read their changes through siwa.account_changes_after).

-- The two functions of every sign-in's nonce are PL/pgSQL rather than SQL: PL/pgSQL keeps its
-- statements' plans for the session, while an SQL function with a SET clause (never inlined) has
-- its body planned again on every call.

-- Stores a new nonce (by its SHA-256) valid for p_ttl; returns when it expires.
CREATE OR REPLACE FUNCTION siwa.issue_nonce(p_nonce_hash bytea, p_ttl interval) RETURNS timestamptz
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    expires timestamptz;
BEGIN
    INSERT INTO siwa.sign_in_nonces (nonce_hash, expires_at) VALUES (p_nonce_hash, now() + p_ttl)
    RETURNING expires_at INTO expires;
    RETURN expires;
END
$$;

-- Stores a new nonce as siwa.issue_nonce does, unless p_max_unspent unexpired nonces are kept
-- already (SIWA_NONCE_MAX_UNSPENT): then expires_at is NULL and retry_after says in how many
-- seconds the first of them expires. Counting stops at the cap (an index range scan of at most
-- p_max_unspent entries); concurrent callers at the cap may pass it by how many run at once.
CREATE OR REPLACE FUNCTION siwa.issue_nonce_bounded(
    p_nonce_hash bytea, p_ttl interval, p_max_unspent integer, OUT expires_at timestamptz, OUT retry_after integer)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF (SELECT count(*) FROM (SELECT 1 FROM siwa.sign_in_nonces n WHERE n.expires_at > now()
                               LIMIT p_max_unspent) unspent) >= p_max_unspent THEN
        SELECT greatest(1, ceil(extract(epoch FROM min(n.expires_at) - now())))::integer INTO retry_after
          FROM siwa.sign_in_nonces n WHERE n.expires_at > now();
        RETURN;
    END IF;
    INSERT INTO siwa.sign_in_nonces AS n (nonce_hash, expires_at) VALUES (p_nonce_hash, now() + p_ttl)
    RETURNING n.expires_at INTO expires_at;
END
$$;

-- Keeps a nonce chosen elsewhere (a web sign-in's state's, siwa.finish_web_sign_in) as a live
-- sign-in nonce for p_ttl; one already kept stays as it is.
CREATE OR REPLACE FUNCTION siwa.keep_nonce(p_nonce_hash bytea, p_ttl interval) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO siwa.sign_in_nonces (nonce_hash, expires_at) VALUES (p_nonce_hash, now() + p_ttl)
    ON CONFLICT (nonce_hash) DO NOTHING;
END
$$;

-- Spends a nonce: true when it existed and had not expired. One DELETE ... RETURNING, so of any
-- number of concurrent callers with the same nonce at most one gets true; an expired row found
-- here is deleted as well (spent either way).
CREATE OR REPLACE FUNCTION siwa.consume_nonce(p_nonce_hash bytea) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    valid boolean;
BEGIN
    DELETE FROM siwa.sign_in_nonces WHERE nonce_hash = p_nonce_hash RETURNING expires_at > now() INTO valid;
    RETURN coalesce(valid, false);
END
$$;

-- What a sign-in needs to know of an account before Apple is called: its status (NULL: no
-- account), whether it holds a refresh token, and how many deletions had been requested
-- (siwa.sign_in lets any request counted after this read win). The app API's one read of
-- siwa.accounts, so the table's SQL stays in its owner's files.
CREATE OR REPLACE FUNCTION siwa.sign_in_state(
    p_client_id text, p_sub text, OUT status text, OUT has_refresh_token boolean, OUT deletion_requests bigint)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    SELECT a.status, a.refresh_token_enc IS NOT NULL, a.deletion_requests
      INTO status, has_refresh_token, deletion_requests
      FROM siwa.accounts a WHERE a.client_id = p_client_id AND a.sub = p_sub;
    IF NOT FOUND THEN
        has_refresh_token := false;
        deletion_requests := 0;
    END IF;
    -- A deletion pending under another client ID of the user's app group blocks this one too.
    IF siwa.deletion_blocks_link(status, p_client_id, p_sub) THEN
        status := 'pending_deletion';
    END IF;
END
$$;

-- Spends the nonce (as siwa.consume_nonce) and reads the sign-in state of (client_id, sub) (as
-- siwa.sign_in_state) in the same call: a sign-in's first round trip. The state is read whatever
-- the nonce was; the caller uses it only once the identity token has proven that sub. Both
-- statements are written here rather than called: each nested call with its SET clause saved and
-- restored search_path, and every statement after it looked the path up again.
CREATE OR REPLACE FUNCTION siwa.consume_nonce_reading(
    p_nonce_hash bytea, p_client_id text, p_sub text,
    OUT valid boolean, OUT status text, OUT has_refresh_token boolean, OUT deletion_requests bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM siwa.sign_in_nonces WHERE nonce_hash = p_nonce_hash RETURNING expires_at > now() INTO valid;
    valid := coalesce(valid, false);
    SELECT a.status, a.refresh_token_enc IS NOT NULL, a.deletion_requests
      INTO status, has_refresh_token, deletion_requests
      FROM siwa.accounts a WHERE a.client_id = p_client_id AND a.sub = p_sub;
    IF NOT FOUND THEN
        has_refresh_token := false;
        deletion_requests := 0;
    END IF;
    -- A deletion pending under another client ID of the user's app group blocks this one too.
    IF siwa.deletion_blocks_link(status, p_client_id, p_sub) THEN
        status := 'pending_deletion';
    END IF;
END
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

-- The account effect of a verified sign-in: one event of the account state machine
-- (siwa.sign_in_succeeded in accounts.sql decides the status), answered with the account as
-- siwa.account shows it and whether its row is new. p_refresh_token_enc: the token of the code this
-- sign-in exchanged (sealed for the row), or NULL. p_deletion_requests_seen: the account's
-- `deletion_requests` when the caller read it and found no deletion pending, before its exchange; a
-- deletion requested since then is not undone (the status stays pending_deletion or deleted, the
-- token is kept for the deletion to revoke, and the caller answers 403). What the client was told
-- about the user once: p_full_name (an object, or NULL: the stored name is kept) and
-- p_real_user_status (the identity token's, as shown; NULL: kept), stored only when the sign-in
-- leaves the account active: a deletion that won keeps no new personal data.
CREATE OR REPLACE FUNCTION siwa.sign_in(
    p_client_id text, p_sub text, p_email text, p_is_private_email boolean, p_refresh_token_enc bytea,
    p_deletion_requests_seen bigint, p_full_name jsonb, p_real_user_status text
) RETURNS TABLE (
    client_id text, sub text, app_user_id text, status text, email text, is_private_email boolean,
    email_forwarding text, sessions_revoked_at timestamptz, linked_at timestamptz, updated_at timestamptz,
    has_refresh_token boolean, full_name jsonb, real_user_status text, is_new boolean
)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    outcome record;
BEGIN
    IF coalesce(p_client_id, '') = '' OR coalesce(p_sub, '') = '' THEN
        RAISE EXCEPTION 'siwa.sign_in: client_id and sub are required' USING ERRCODE = '22023';
    END IF;
    IF p_full_name IS NOT NULL AND jsonb_typeof(p_full_name) <> 'object' THEN
        RAISE EXCEPTION 'siwa.sign_in: full_name must be an object' USING ERRCODE = '22023';
    END IF;
    outcome := siwa.sign_in_succeeded(p_client_id, p_sub, NULL, p_refresh_token_enc, p_email, p_is_private_email,
                                      p_deletion_requests_seen);
    -- The answer: siwa.account's columns, read here (a cached plan on the row this transaction
    -- holds locked) rather than through siwa.account, an SQL function planned again on every call.
    IF outcome.status = 'active' AND (p_full_name IS NOT NULL OR p_real_user_status IS NOT NULL) THEN
        RETURN QUERY
            SELECT p.*, outcome.created FROM siwa.account_profile_signed_in(p_client_id, p_sub, p_full_name, p_real_user_status) p;
    ELSE
        RETURN QUERY
            SELECT a.client_id, a.sub, a.app_user_id, a.status, a.email, a.is_private_email, a.email_forwarding,
                   a.sessions_revoked_at, a.linked_at, a.updated_at, a.refresh_token_enc IS NOT NULL, a.full_name,
                   a.real_user_status, outcome.created
              FROM siwa.accounts a WHERE a.client_id = p_client_id AND a.sub = p_sub;
    END IF;
END
$$;

-- The same without the profile, for callers from before it (workers of the previous release).
CREATE OR REPLACE FUNCTION siwa.sign_in(
    p_client_id text, p_sub text, p_email text, p_is_private_email boolean, p_refresh_token_enc bytea,
    p_deletion_requests_seen bigint
) RETURNS TABLE (
    client_id text, sub text, app_user_id text, status text, email text, is_private_email boolean,
    email_forwarding text, sessions_revoked_at timestamptz, linked_at timestamptz, updated_at timestamptz,
    has_refresh_token boolean, is_new boolean
)
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.client_id, s.sub, s.app_user_id, s.status, s.email, s.is_private_email, s.email_forwarding,
           s.sessions_revoked_at, s.linked_at, s.updated_at, s.has_refresh_token, s.is_new
      FROM siwa.sign_in(p_client_id, p_sub, p_email, p_is_private_email, p_refresh_token_enc, p_deletion_requests_seen,
                        NULL::jsonb, NULL::text) s
$$;

-- The same for workers of the previous release during an upgrade, which pass when they read the
-- account (`p_checked_at`) instead of the count: a deletion whose revoke had not finished by then
-- counts as requested after the read (that release's rule, without its clock skew), so the count
-- handed on is one short of the account's.
DROP FUNCTION IF EXISTS siwa.sign_in(text, text, text, boolean, bytea);
CREATE OR REPLACE FUNCTION siwa.sign_in(
    p_client_id text, p_sub text, p_email text, p_is_private_email boolean, p_refresh_token_enc bytea,
    p_checked_at timestamptz
) RETURNS TABLE (
    client_id text, sub text, app_user_id text, status text, email text, is_private_email boolean,
    email_forwarding text, sessions_revoked_at timestamptz, linked_at timestamptz, updated_at timestamptz,
    has_refresh_token boolean, is_new boolean
)
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM siwa.sign_in(p_client_id, p_sub, p_email, p_is_private_email, p_refresh_token_enc,
        (SELECT coalesce(max(a.deletion_requests), 0)
                - CASE WHEN EXISTS (SELECT 1 FROM siwa.jobs r
                                     WHERE r.client_id = p_client_id AND r.sub = p_sub AND r.kind = 'revoke'
                                       AND NOT r.args ? 'late_token'
                                       AND (r.finalized_at IS NULL OR r.finalized_at > p_checked_at))
                       THEN 1 ELSE 0 END
           FROM siwa.accounts a WHERE a.client_id = p_client_id AND a.sub = p_sub))
$$;

-- The transactions writing siwa.account_changes now (other than the caller's): every writer holds
-- the table's ROW EXCLUSIVE lock from before it takes a change id until it ends. A prepared
-- transaction has no pid. What the change feed waits for, and what `siwa status` names when one
-- holds the feed back.
CREATE OR REPLACE FUNCTION siwa.change_writers() RETURNS TABLE (virtualtransaction text, pid integer)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT l.virtualtransaction, l.pid FROM pg_locks l
     WHERE l.locktype = 'relation' AND l.relation = 'siwa.account_changes'::regclass
       AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
       AND l.mode = 'RowExclusiveLock' AND l.granted AND l.pid IS DISTINCT FROM pg_backend_pid();
$$;

-- The change feed (GET /v1/changes, and apps reading the table): the changes after p_after,
-- ascending by id, at most p_limit, and only ids that no running transaction can still come to
-- precede. A change id is taken when its row is written, not when its transaction commits, so a
-- transaction holding a smaller id can commit after one holding a larger id: a reader that moved
-- past the larger one would never see the smaller (two workers' batches do this all the time).
-- Every writer holds the table's ROW EXCLUSIVE lock from before it takes an id until it ends
-- (siwa.change_writers). So once every transaction holding it just after the newest id was read has
-- ended, every id up to that one is final: committed, or never will be (a rollback's gap). Waits for
-- them at most p_wait; past it (an app transaction left open), serves only the gap-free run that
-- follows p_after, whose rows are all committed. A snapshot fixed for the whole transaction
-- (REPEATABLE READ, SERIALIZABLE) never sees what commits during the wait: the gap-free run only.
CREATE OR REPLACE FUNCTION siwa.account_changes_after(p_after bigint, p_limit integer, p_wait interval DEFAULT interval '1 second')
RETURNS SETOF siwa.account_changes
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    newest bigint;
    writers text[];
    deadline timestamptz := clock_timestamp() + p_wait;
BEGIN
    SELECT max(id) INTO newest FROM siwa.account_changes;
    IF newest IS NULL OR newest <= p_after THEN
        RETURN;
    END IF;
    IF current_setting('transaction_isolation') = 'read committed' THEN
        LOOP
            SELECT array_agg(w.virtualtransaction) INTO writers
              FROM siwa.change_writers() w
             WHERE writers IS NULL OR w.virtualtransaction = ANY (writers);
            EXIT WHEN writers IS NULL OR clock_timestamp() >= deadline;
            PERFORM pg_sleep(0.002);
        END LOOP;
        IF writers IS NULL THEN
            RETURN QUERY SELECT * FROM siwa.account_changes c
                          WHERE c.id > p_after AND c.id <= newest ORDER BY c.id LIMIT p_limit;
            RETURN;
        END IF;
    END IF;
    RETURN QUERY
        WITH run AS (
            SELECT s.id, s.id - row_number() OVER (ORDER BY s.id) AS start
              FROM (SELECT id FROM siwa.account_changes WHERE id > p_after AND id <= newest ORDER BY id LIMIT p_limit) s)
        SELECT c.* FROM siwa.account_changes c JOIN run ON run.id = c.id
         WHERE run.start = p_after ORDER BY c.id;
END
$$;

-- Privileges: the worker (which serves the app API) calls these; apps, only the change feed.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA siwa FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_worker') THEN
        GRANT EXECUTE ON FUNCTION siwa.issue_nonce(bytea, interval), siwa.issue_nonce_bounded(bytea, interval, integer),
                                  siwa.consume_nonce(bytea), siwa.keep_nonce(bytea, interval),
                                  siwa.sign_in_state(text, text), siwa.consume_nonce_reading(bytea, text, text),
                                  siwa.prune_nonces(integer), siwa.sign_in(text, text, text, boolean, bytea, timestamptz),
                                  siwa.sign_in(text, text, text, boolean, bytea, bigint),
                                  siwa.sign_in(text, text, text, boolean, bytea, bigint, jsonb, text),
                                  siwa.account_changes_after(bigint, integer, interval), siwa.change_writers()
           TO siwa_worker;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_app') THEN
        GRANT EXECUTE ON FUNCTION siwa.account_changes_after(bigint, integer, interval), siwa.change_writers() TO siwa_app;
    END IF;
END
$$;
