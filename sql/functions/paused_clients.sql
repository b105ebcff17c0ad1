-- siwa.paused_clients: the Apple circuit breaker. A client ID whose credentials Apple refused
-- (invalid_client, unauthorized_client) is paused, so its jobs stop spending calls Apple will refuse;
-- one job per probe interval goes through to find out whether the credentials work again
-- (AppleJobs' AppleJobContext decides when to call these). Read by `siwa status`, the console and
-- the backlog gauges. Applied after the numbered migrations whenever this file changes (see
-- sql/README.md); the table is in 001_schema.sql.

-- Apple refused our credentials for p_client_id: pause it (again), next probe after p_probe_seconds.
-- A client paused already keeps its first paused_at: the console shows how long it has been down.
CREATE OR REPLACE FUNCTION siwa.pause_client(p_client_id text, p_reason text, p_probe_seconds double precision)
RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO siwa.paused_clients (client_id, reason, paused_at, next_probe_at)
    VALUES (p_client_id, p_reason, now(), now() + make_interval(secs => p_probe_seconds))
    ON CONFLICT (client_id) DO UPDATE
       SET reason = EXCLUDED.reason, next_probe_at = EXCLUDED.next_probe_at
$$;

-- A call for p_client_id succeeded: it is not paused any more. True when it was.
CREATE OR REPLACE FUNCTION siwa.resume_client(p_client_id text) RETURNS boolean
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    WITH resumed AS (DELETE FROM siwa.paused_clients WHERE client_id = p_client_id RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM resumed)
$$;

-- Whether a job for p_client_id may call Apple now. NULL: the client is not paused. 0: it is
-- paused and this caller is the probe (the next probe moves p_probe_seconds ahead, so concurrent
-- jobs keep waiting). Otherwise the seconds until the next probe (at least 1).
CREATE OR REPLACE FUNCTION siwa.paused_client_wait(p_client_id text, p_probe_seconds double precision)
RETURNS double precision
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    WITH probe AS (
        UPDATE siwa.paused_clients SET next_probe_at = now() + make_interval(secs => p_probe_seconds)
         WHERE client_id = p_client_id AND next_probe_at <= now()
        RETURNING 0::float8 AS wait)
    SELECT wait FROM probe
    UNION ALL
    SELECT greatest(extract(epoch FROM next_probe_at - now())::float8, 1) FROM siwa.paused_clients
     WHERE client_id = p_client_id AND NOT EXISTS (SELECT 1 FROM probe)
$$;

-- Privileges: the worker (its Apple jobs); PUBLIC nothing (see jobs.sql).
REVOKE EXECUTE ON FUNCTION siwa.pause_client(text, text, double precision),
                           siwa.resume_client(text),
                           siwa.paused_client_wait(text, double precision)
  FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_worker') THEN
        GRANT EXECUTE ON FUNCTION siwa.pause_client(text, text, double precision),
                                  siwa.resume_client(text),
                                  siwa.paused_client_wait(text, double precision)
           TO siwa_worker;
    END IF;
END
$$;
