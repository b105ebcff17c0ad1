-- Web and Android sign-in, served (deploy/web-sign-in.md; tables in 019_web_sign_in.sql). The receiver
-- (internet-facing, no secrets) calls the first two, as its own role, through SECURITY DEFINER:
-- it may keep a state, spend one and store a ticket, and nothing else of these tables (it reads no
-- ticket, no state but the one it spends, no nonce). The worker's app API spends tickets and prunes.
--
-- Lifetimes are fixed here, not passed by the caller (deploy/web-sign-in.md's: a state 10 minutes,
-- a ticket 5), and so is the largest bound a caller may ask for, so a compromised receiver can
-- neither keep rows alive nor grow the tables past 1,000,000 rows each. The bound is checked by
-- counting at most that many rows: concurrent callers may overshoot it by their own number, no more.

-- Keeps a new state (by its SHA-256) for GET /apple/sign-in: false, and nothing kept, when
-- p_max_unspent unexpired states exist already (the receiver answers 429). Deletes up to 100
-- expired states first, so a flood that stops leaves room again within one call per 100 rows.
CREATE OR REPLACE FUNCTION siwa.begin_web_sign_in(
    p_state_hash bytea, p_client_id text, p_return_to text, p_app_state text, p_nonce text, p_redirect_uri text,
    p_max_unspent integer
) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    bound constant integer := least(greatest(coalesce(p_max_unspent, 0), 0), 1000000);
BEGIN
    DELETE FROM siwa.web_sign_in_states
     WHERE state_hash IN (SELECT s.state_hash FROM siwa.web_sign_in_states s WHERE s.expires_at <= now()
                           ORDER BY s.expires_at LIMIT 100);
    IF (SELECT count(*) FROM (SELECT 1 FROM siwa.web_sign_in_states LIMIT bound) s) >= bound THEN
        RETURN false;
    END IF;
    INSERT INTO siwa.web_sign_in_states (state_hash, client_id, return_to, app_state, nonce, redirect_uri, expires_at)
    VALUES (p_state_hash, p_client_id, p_return_to, p_app_state, p_nonce, p_redirect_uri, now() + interval '10 minutes');
    RETURN true;
END
$$;

-- Apple's form_post to the callback: spends the state (found or not, expired or not: one DELETE),
-- and answers where to send the browser. valid: the state existed and had not expired (else the
-- receiver answers 400 and redirects nowhere). With a ticket (p_ticket_hash not NULL: Apple
-- answered a code and an identity token), keeps the ticket for 5 minutes with the state's client
-- ID, nonce and redirect URI, and makes the state's nonce a live sign-in nonce until the ticket
-- expires (siwa.consume_nonce spends it when the ticket is redeemed, as any sign-in's);
-- ticket_stored is false when p_max_unspent unexpired tickets exist already (the receiver then
-- returns the browser with an error). Without a ticket (Apple answered an error, the user
-- cancelled), only the state is spent.
CREATE OR REPLACE FUNCTION siwa.finish_web_sign_in(
    p_state_hash bytea, p_ticket_hash bytea, p_identity_token text, p_authorization_code text, p_full_name jsonb,
    p_max_unspent integer,
    OUT valid boolean, OUT return_to text, OUT app_state text, OUT ticket_stored boolean
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    bound constant integer := least(greatest(coalesce(p_max_unspent, 0), 0), 1000000);
    spent record;
BEGIN
    ticket_stored := false;
    DELETE FROM siwa.web_sign_in_states s WHERE s.state_hash = p_state_hash
    RETURNING s.client_id, s.return_to, s.app_state, s.nonce, s.redirect_uri, s.expires_at > now() AS live INTO spent;
    valid := coalesce(spent.live, false);
    IF NOT valid THEN
        RETURN;
    END IF;
    return_to := spent.return_to;
    app_state := spent.app_state;
    IF p_ticket_hash IS NULL THEN
        RETURN;
    END IF;
    DELETE FROM siwa.web_sign_in_tickets
     WHERE ticket_hash IN (SELECT t.ticket_hash FROM siwa.web_sign_in_tickets t WHERE t.expires_at <= now()
                            ORDER BY t.expires_at LIMIT 100);
    IF (SELECT count(*) FROM (SELECT 1 FROM siwa.web_sign_in_tickets LIMIT bound) t) >= bound THEN
        RETURN;
    END IF;
    INSERT INTO siwa.web_sign_in_tickets (ticket_hash, client_id, identity_token, nonce, authorization_code, redirect_uri,
                                          full_name, expires_at)
    VALUES (p_ticket_hash, spent.client_id, p_identity_token, spent.nonce, p_authorization_code, spent.redirect_uri,
            p_full_name, now() + interval '5 minutes');
    PERFORM siwa.keep_nonce(sha256(convert_to(spent.nonce, 'UTF8')), interval '5 minutes');
    ticket_stored := true;
END
$$;

-- POST /v1/sign-in {"ticket"}: spends the ticket (one DELETE, so one of any number of concurrent
-- redemptions gets its row) and returns what the sign-in is made of; no row when it is unknown,
-- spent or expired (an expired row found here is deleted as well).
CREATE OR REPLACE FUNCTION siwa.redeem_web_sign_in_ticket(p_ticket_hash bytea) RETURNS TABLE (
    client_id text, identity_token text, nonce text, authorization_code text, redirect_uri text, full_name jsonb
)
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    WITH spent AS (
        DELETE FROM siwa.web_sign_in_tickets t WHERE t.ticket_hash = p_ticket_hash
        RETURNING t.client_id, t.identity_token, t.nonce, t.authorization_code, t.redirect_uri, t.full_name, t.expires_at)
    SELECT s.client_id, s.identity_token, s.nonce, s.authorization_code, s.redirect_uri, s.full_name
      FROM spent s WHERE s.expires_at > now()
$$;

-- Deletes up to p_limit expired states and as many expired tickets (a ticket holds an identity
-- token and a code: gone within a minute of expiring, traffic or not); returns how many in all.
CREATE OR REPLACE FUNCTION siwa.prune_web_sign_ins(p_limit integer) RETURNS integer
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    WITH states AS (
        DELETE FROM siwa.web_sign_in_states
         WHERE state_hash IN (SELECT state_hash FROM siwa.web_sign_in_states WHERE expires_at <= now()
                               ORDER BY expires_at LIMIT p_limit)
        RETURNING 1),
    tickets AS (
        DELETE FROM siwa.web_sign_in_tickets
         WHERE ticket_hash IN (SELECT ticket_hash FROM siwa.web_sign_in_tickets WHERE expires_at <= now()
                                ORDER BY expires_at LIMIT p_limit)
        RETURNING 1)
    SELECT ((SELECT count(*) FROM states) + (SELECT count(*) FROM tickets))::integer
$$;

-- Privileges: the receiver keeps and spends states and stores tickets (as the functions' owner);
-- the worker redeems and prunes (on its own grants of 019), and may call the receiver's two as
-- well (003's grant of every function to it, re-run by a DBA, then changes nothing).
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA siwa FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_receiver') THEN
        GRANT EXECUTE ON FUNCTION siwa.begin_web_sign_in(bytea, text, text, text, text, text, integer),
                                  siwa.finish_web_sign_in(bytea, bytea, text, text, jsonb, integer)
           TO siwa_receiver;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_worker') THEN
        GRANT EXECUTE ON FUNCTION siwa.begin_web_sign_in(bytea, text, text, text, text, text, integer),
                                  siwa.finish_web_sign_in(bytea, bytea, text, text, jsonb, integer),
                                  siwa.redeem_web_sign_in_ticket(bytea), siwa.prune_web_sign_ins(integer)
           TO siwa_worker;
    END IF;
END
$$;
