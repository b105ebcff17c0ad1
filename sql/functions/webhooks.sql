-- Webhooks: the endpoint (siwa.webhook_endpoint, registered by each worker with a webhook URL), the change
-- object a delivery sends, the backlog, `siwa webhooks disable`. The deliveries are `webhook` jobs:
-- queued, claimed, finished, leased and cancelled by the functions of jobs.sql (every write of
-- siwa.jobs lives there). Applied after the numbered migrations whenever this file changes;
-- sql/007_webhooks.sql holds the table, indexes and trigger.

-- The change object of `GET /v1/changes` (Sources/AppAPI/README.md), as the webhook body: compact
-- JSON, keys in that object's order, created_at in RFC 3339 UTC with milliseconds (as /v1/changes
-- writes it). Built in one place
-- so every retry sends the same bytes. No SET clause: the planner inlines it into the claim.
CREATE OR REPLACE FUNCTION siwa.change_object(c siwa.account_changes) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT '{"id":' || c.id
        || ',"client_id":' || coalesce(to_json(c.client_id)::text, 'null')
        || ',"sub":' || coalesce(to_json(c.sub)::text, 'null')
        || ',"app_user_id":' || coalesce(to_json(c.app_user_id)::text, 'null')
        || ',"change":' || coalesce(to_json(c.change)::text, 'null')
        || ',"status":' || coalesce(to_json(c.status)::text, 'null')
        || ',"reason":' || coalesce(to_json(c.reason)::text, 'null')
        || ',"created_at":"' || to_char(c.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') || '"}'
$$;

-- What `siwa status` and the gauges show: undelivered (available or running) deliveries and the
-- age of the oldest change among them, deliveries that failed at least once and are still
-- retried, discarded ones (kept; they hold back their account's later changes), and how many
-- wait behind a discarded one.
CREATE OR REPLACE FUNCTION siwa.webhook_backlog()
RETURNS TABLE (undelivered bigint, oldest_seconds double precision, failing bigint, discarded bigint,
               blocked_by_discarded bigint)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT count(*) FILTER (WHERE j.state IN ('available', 'running')),
           extract(epoch FROM now() - min(j.created_at) FILTER (WHERE j.state IN ('available', 'running')))::float8,
           count(*) FILTER (WHERE j.state IN ('available', 'running') AND jsonb_array_length(j.errors) > 0),
           count(*) FILTER (WHERE j.state = 'discarded'),
           count(*) FILTER (WHERE j.state = 'available' AND EXISTS (
               SELECT 1 FROM siwa.jobs d
                WHERE d.kind = 'webhook' AND d.state = 'discarded'
                  AND d.client_id = j.client_id AND d.sub = j.sub AND d.id < j.id))
      FROM siwa.jobs j
     WHERE j.kind = 'webhook' AND j.state IN ('available', 'running', 'discarded')
$$;

-- `siwa webhooks disable`: no delivery is queued for new changes any more (the endpoint goes), and
-- the queued (available or discarded) ones are cancelled, kept with outcome `webhooks_disabled`.
-- Returns how many were cancelled.
CREATE OR REPLACE FUNCTION siwa.disable_webhooks() RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM siwa.webhook_endpoint;
    RETURN siwa.cancel_webhook_deliveries();
END
$$;

-- A worker with SIWA_WEBHOOK_URL registers its endpoint at start: from now on every change queues
-- a delivery (idempotent; seen_at is also the heartbeat `siwa status` shows).
CREATE OR REPLACE FUNCTION siwa.register_webhook_endpoint(p_endpoint text) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO siwa.webhook_endpoint (singleton, endpoint) VALUES (true, p_endpoint)
    ON CONFLICT (singleton) DO UPDATE SET endpoint = EXCLUDED.endpoint, seen_at = now()
$$;

-- The worker's heartbeat on its registration. It never re-creates one `siwa webhooks disable`
-- removed: a worker registers only when it starts.
CREATE OR REPLACE FUNCTION siwa.touch_webhook_endpoint() RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    UPDATE siwa.webhook_endpoint SET seen_at = now()
$$;

-- Privileges: the worker delivers; nobody else (see jobs.sql on PUBLIC).
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA siwa FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_worker') THEN
        EXECUTE 'GRANT EXECUTE ON FUNCTION siwa.change_object(siwa.account_changes) TO siwa_worker';
        EXECUTE 'GRANT EXECUTE ON FUNCTION siwa.webhook_backlog() TO siwa_worker';
        EXECUTE 'GRANT EXECUTE ON FUNCTION siwa.disable_webhooks() TO siwa_worker';
        EXECUTE 'GRANT EXECUTE ON FUNCTION siwa.register_webhook_endpoint(text) TO siwa_worker';
        EXECUTE 'GRANT EXECUTE ON FUNCTION siwa.touch_webhook_endpoint() TO siwa_worker';
    END IF;
END
$$;
