-- `siwa accounts rotate-keys` (Sources/StoredTokens/TokenKeyRotation.swift): the stored
-- refresh tokens sealed with a key other than the current one, read in key order and re-sealed one
-- by one. Swift opens and seals (the keys never reach the database); these functions are the only
-- SQL it sends. A sealed token starts with a version byte, then the key id's length and the key id
-- (StoredTokens' TokenBox): `p_key_id` is the current key's id, as bytes.
-- Applied after the numbered migrations whenever this file changes (see sql/README.md).

-- Tokens still sealed with another key: current and retired ones (a deletion revokes both).
CREATE OR REPLACE FUNCTION siwa.tokens_sealed_with_other_keys(p_key_id bytea) RETURNS bigint
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT (SELECT count(*) FROM siwa.accounts
             WHERE refresh_token_enc IS NOT NULL
               AND substring(refresh_token_enc FROM 3 FOR get_byte(refresh_token_enc, 1)) <> p_key_id)
         + (SELECT count(*) FROM siwa.accounts a, unnest(a.retired_tokens_enc) AS t(token)
             WHERE cardinality(a.retired_tokens_enc) > 0
               AND substring(t.token FROM 3 FOR get_byte(t.token, 1)) <> p_key_id)
$$;

-- Up to p_limit accounts after (p_after_client_id, p_after_sub) whose current token is sealed with
-- another key, locked (FOR UPDATE SKIP LOCKED) in the caller's transaction.
CREATE OR REPLACE FUNCTION siwa.current_tokens_to_reseal(
    p_key_id bytea, p_after_client_id text, p_after_sub text, p_limit integer
) RETURNS TABLE (client_id text, sub text, refresh_token_enc bytea)
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    SELECT a.client_id, a.sub, a.refresh_token_enc FROM siwa.accounts a
     WHERE a.refresh_token_enc IS NOT NULL
       AND substring(a.refresh_token_enc FROM 3 FOR get_byte(a.refresh_token_enc, 1)) <> p_key_id
       AND (a.client_id, a.sub) > (p_after_client_id, p_after_sub)
     ORDER BY a.client_id, a.sub
     LIMIT p_limit
     FOR UPDATE SKIP LOCKED
$$;

-- The retired tokens (kept for a later deletion) of up to p_limit accounts after (p_after_client_id,
-- p_after_sub) that hold any, one row a token, the accounts locked as above. Every key's tokens:
-- the caller skips the current key's.
CREATE OR REPLACE FUNCTION siwa.retired_tokens_to_reseal(p_after_client_id text, p_after_sub text, p_limit integer)
RETURNS TABLE (client_id text, sub text, token bytea)
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    SELECT a.client_id, a.sub, t.token FROM (
        SELECT r.client_id, r.sub, r.retired_tokens_enc FROM siwa.accounts r
         WHERE cardinality(r.retired_tokens_enc) > 0 AND (r.client_id, r.sub) > (p_after_client_id, p_after_sub)
         ORDER BY r.client_id, r.sub
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED) a, unnest(a.retired_tokens_enc) AS t(token)
     ORDER BY a.client_id, a.sub
$$;

-- Privileges: the worker's login runs the operator commands (see transfer.sql); PUBLIC nothing
-- (see jobs.sql). The write, siwa.reseal_token, is in accounts.sql.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA siwa FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_worker') THEN
        GRANT EXECUTE ON FUNCTION siwa.tokens_sealed_with_other_keys(bytea),
                                  siwa.current_tokens_to_reseal(bytea, text, text, integer),
                                  siwa.retired_tokens_to_reseal(text, text, integer)
           TO siwa_worker;
    END IF;
END
$$;
