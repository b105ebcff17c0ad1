-- Webhook deliveries: queueing, claim, results, leases, backlog. Applied after the numbered
-- migrations whenever this file changes; sql/007_webhooks.sql holds the table, indexes and trigger.

-- Queues one `webhook` job per new change, in change order, while an endpoint is registered.
-- SECURITY DEFINER: whichever role records a change (worker, app functions), its delivery is
-- queued; the caller needs no rights on siwa.jobs or siwa.webhook_endpoint for it.
CREATE OR REPLACE FUNCTION siwa.queue_webhook_deliveries() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM siwa.webhook_endpoint) THEN
        -- max_attempts: deliveries end by time (siwa.webhook_retry: the retry window), not by count.
        INSERT INTO siwa.jobs (kind, priority, client_id, sub, args, max_attempts)
        SELECT 'webhook', 3, c.client_id, c.sub, jsonb_build_object('change_id', c.id), 2147483647
          FROM new_changes c
         ORDER BY c.id;
    END IF;
    RETURN NULL;
END
$$;

-- The change object of CONTRACT.md ("App API", /v1/changes), as the webhook body: compact JSON,
-- keys in the contract's order, created_at in RFC 3339 UTC with milliseconds (as /v1/changes
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

-- Claims up to p_limit due deliveries, each the oldest undelivered change of its account (an
-- account whose earlier change is still available, running or discarded is skipped: order per
-- account), leased to p_worker. Returns what the sender needs: the body, and when the change was
-- made (the delivery delay's metric). What a failure does is siwa.finish_webhook_deliveries's,
-- from the job row: the sender needs neither the failures so far nor a clock.
-- Its earlier shape returned failures, first_failed_at and claimed_at for a retry rule in Swift:
-- dropped once (the same arguments, another result type), not on every re-application.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_proc
                WHERE oid = 'siwa.claim_webhook_deliveries(text, integer, double precision)'::regprocedure
                  AND 'first_failed_at' = ANY (proargnames)) THEN
        DROP FUNCTION siwa.claim_webhook_deliveries(text, integer, double precision);
    END IF;
EXCEPTION WHEN undefined_function THEN
    NULL;  -- a database that never had it
END
$$;
CREATE OR REPLACE FUNCTION siwa.claim_webhook_deliveries(
    p_worker text, p_limit integer, p_lease_seconds double precision
) RETURNS TABLE (job_id bigint, attempt integer, change_id bigint, body text, change_created_at timestamptz)
-- plpgsql rather than sql: its statements' plans are cached across calls (an sql function's body
-- is planned again on every call). Key-driven (the claim index in order, the account index for
-- the ordering check) whatever stale statistics say: a queue analyzed empty, then filled, must
-- not turn every claim into a scan of the backlog.
-- The ordering check is a scalar subquery on purpose: PostgreSQL never turns one into a join, so
-- it always runs per candidate with the candidate's account as the index keys. Written as NOT
-- EXISTS it became an anti join, and on a queue analyzed empty the planner scanned the whole
-- account index for every candidate (600 ms and 300,000 buffers a claim with 10,000 queued; the
-- benchmark's burn-downs ran at the pace of autovacuum's next ANALYZE).
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH due AS (
        SELECT j.id FROM siwa.jobs j
         WHERE j.state = 'available' AND j.kind = 'webhook' AND j.run_at <= now()
           -- j is its account's oldest undelivered change (j itself is in the set, so min <= j.id).
           AND j.id = (SELECT min(e.id) FROM siwa.jobs e
                        WHERE e.kind = 'webhook' AND e.state IN ('available', 'running', 'discarded')
                          AND e.client_id = j.client_id AND e.sub = j.sub)
         ORDER BY j.run_at, j.id
         LIMIT p_limit
           FOR UPDATE OF j SKIP LOCKED
    ), claimed AS (
        UPDATE siwa.jobs j
           SET state = 'running', attempt = j.attempt + 1, locked_by = p_worker,
               locked_until = now() + make_interval(secs => p_lease_seconds)
          FROM due
         WHERE j.id = due.id
        RETURNING j.id, j.attempt, (j.args ->> 'change_id')::bigint AS change_id
    )
    SELECT c.id, c.attempt, c.change_id, CASE WHEN a.id IS NOT NULL THEN siwa.change_object(a) END, a.created_at
      FROM claimed c
      LEFT JOIN siwa.account_changes a ON a.id = c.change_id
     ORDER BY c.id;
END
$$;

-- Records what each claimed delivery's attempt got, fenced by (id, attempt), and decides what
-- follows: the sender only reports. p_statuses[i] is the HTTP status answered (0 or NULL: no
-- answer), p_errors[i] the error text of an attempt that failed (no answer, or a status that is
-- not 2xx; '' or NULL: none), bound as arrays without NULLs.
--   - a 2xx is delivered: `completed`, outcome `delivered <status>`;
--   - nothing sent (no status, no error: the change row is gone, deleted by hand): `completed`,
--     outcome `change_missing`, nothing held back;
--   - anything else is a failure, its error appended to `errors`, then siwa.webhook_retry
--     (queue.sql) says, from the failures so far and the first one's time: `available` at the
--     run_at it gives, or `discarded` once p_window_seconds (the retry window) have passed since
--     the first failure, kept with its errors, change id and run_at for `siwa jobs retry`.
--     p_base and p_cap are the backoff's (SIWA_RETRY_BASE, capped at an hour, as for every job).
-- A retried delivery's later changes wait with it (their run_at follows), so the claim does not
-- walk past them while their head waits. Returns the state each job got and, when retried, in how
-- many seconds (for the sender's logs); a job whose lease was lost is absent.
DROP FUNCTION IF EXISTS siwa.finish_webhook_deliveries(bigint[], bigint[], text[], text[], bigint[]);
CREATE OR REPLACE FUNCTION siwa.finish_webhook_deliveries(
    p_ids bigint[], p_attempts bigint[], p_statuses integer[], p_errors text[],
    p_window_seconds double precision, p_base double precision, p_cap double precision
) RETURNS TABLE (job_id bigint, state text, retry_in double precision)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off AS $$
#variable_conflict use_column
DECLARE
    f record;
BEGIN
    FOR f IN
        WITH r AS (
            SELECT r.id, r.attempt, nullif(r.error, '') AS error,
                   CASE WHEN r.status BETWEEN 200 AND 299 THEN 'delivered ' || r.status
                        WHEN nullif(r.status, 0) IS NULL AND nullif(r.error, '') IS NULL THEN 'change_missing' END AS outcome
              FROM unnest(p_ids, p_attempts, p_statuses, p_errors) AS r(id, attempt, status, error)
        ), decided AS (
            -- Delivered: nothing to decide (the hot path: no row read twice, no call).
            SELECT r.id, r.attempt, r.outcome, NULL::text AS error, NULL::text AS next_state,
                   NULL::timestamptz AS next_run_at
              FROM r WHERE r.outcome IS NOT NULL
            UNION ALL
            -- A failure: what follows it, from the failures so far.
            SELECT r.id, r.attempt, NULL, coalesce(r.error, 'answered without an error text'), w.state, w.run_at
              FROM r JOIN siwa.jobs x ON x.id = r.id,
                   LATERAL siwa.webhook_retry(jsonb_array_length(x.errors) + 1, (x.errors -> 0 ->> 'at')::timestamptz,
                                              p_window_seconds, p_base, p_cap, x.run_at) w
             WHERE r.outcome IS NULL
        )
        UPDATE siwa.jobs j
           SET state = coalesce(d.next_state, 'completed'),
               outcome = d.outcome,
               errors = CASE WHEN d.outcome IS NOT NULL THEN j.errors
                             ELSE j.errors || jsonb_build_array(jsonb_build_object(
                                      'attempt', j.attempt, 'at', now(), 'error', d.error)) END,
               run_at = coalesce(d.next_run_at, j.run_at),
               finalized_at = CASE WHEN d.next_state = 'available' THEN NULL ELSE now() END,
               locked_by = NULL, locked_until = NULL
          FROM decided d
         -- `available` with the same attempt: rescued after the lease ran out (database down while the
         -- result waited) and not claimed again since; the result still stands.
         WHERE j.id = d.id AND j.state IN ('running', 'available') AND j.attempt = d.attempt
        RETURNING j.id, j.state, j.client_id, j.sub, j.run_at
    LOOP
        job_id := f.id;
        state := f.state;
        retry_in := CASE WHEN f.state = 'available' THEN greatest(extract(epoch FROM f.run_at - now())::float8, 0) END;
        RETURN NEXT;
        -- A retried delivery's later changes follow its run_at, looked up by its account's keys.
        -- (Written as a join over all finished rows, a queue analyzed empty made the planner walk
        -- the whole backlog on every write, retries or not.)
        IF f.state = 'available' THEN
            UPDATE siwa.jobs s SET run_at = f.run_at
             WHERE s.kind = 'webhook' AND s.state = 'available'
               AND s.client_id = f.client_id AND s.sub = f.sub AND s.id > f.id AND s.run_at < f.run_at;
        END IF;
    END LOOP;
END
$$;

-- Heartbeat of the deliveries a worker holds, and their hand-back at shutdown (no error counted).
CREATE OR REPLACE FUNCTION siwa.extend_webhook_leases(p_ids bigint[], p_attempts bigint[], p_lease_seconds double precision)
RETURNS integer
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    WITH extended AS (
        UPDATE siwa.jobs j SET locked_until = now() + make_interval(secs => p_lease_seconds)
          FROM unnest(p_ids, p_attempts) AS h(id, attempt)
         WHERE j.id = h.id AND j.state = 'running' AND j.attempt = h.attempt
        RETURNING 1
    )
    SELECT count(*)::integer FROM extended
$$;

CREATE OR REPLACE FUNCTION siwa.release_webhook_deliveries(p_ids bigint[], p_attempts bigint[])
RETURNS integer
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    WITH released AS (
        UPDATE siwa.jobs j SET state = 'available', run_at = now(), locked_by = NULL, locked_until = NULL
          FROM unnest(p_ids, p_attempts) AS h(id, attempt)
         WHERE j.id = h.id AND j.state = 'running' AND j.attempt = h.attempt
        RETURNING 1
    )
    SELECT count(*)::integer FROM released
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
DECLARE
    cancelled integer;
BEGIN
    DELETE FROM siwa.webhook_endpoint;
    UPDATE siwa.jobs SET state = 'cancelled', outcome = 'webhooks_disabled', finalized_at = now(),
           locked_by = NULL, locked_until = NULL
     WHERE kind = 'webhook' AND state IN ('available', 'discarded');
    GET DIAGNOSTICS cancelled = ROW_COUNT;
    RETURN cancelled;
END
$$;

-- Privileges: the worker delivers; nobody else (see queue.sql on PUBLIC). The trigger function runs
-- as its owner whoever records a change.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA siwa FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_worker') THEN
        -- The trigger function too, as 003 grants every function of the schema to the worker (a
        -- trigger's EXECUTE is not checked when it fires; this keeps 003 re-runnable unchanged).
        EXECUTE 'GRANT EXECUTE ON FUNCTION siwa.queue_webhook_deliveries() TO siwa_worker';
        EXECUTE 'GRANT EXECUTE ON FUNCTION siwa.change_object(siwa.account_changes) TO siwa_worker';
        EXECUTE 'GRANT EXECUTE ON FUNCTION siwa.claim_webhook_deliveries(text, integer, double precision) TO siwa_worker';
        EXECUTE 'GRANT EXECUTE ON FUNCTION siwa.finish_webhook_deliveries(bigint[], bigint[], integer[], text[],
                 double precision, double precision, double precision) TO siwa_worker';
        EXECUTE 'GRANT EXECUTE ON FUNCTION siwa.extend_webhook_leases(bigint[], bigint[], double precision) TO siwa_worker';
        EXECUTE 'GRANT EXECUTE ON FUNCTION siwa.release_webhook_deliveries(bigint[], bigint[]) TO siwa_worker';
        EXECUTE 'GRANT EXECUTE ON FUNCTION siwa.webhook_backlog() TO siwa_worker';
        EXECUTE 'GRANT EXECUTE ON FUNCTION siwa.disable_webhooks() TO siwa_worker';
    END IF;
END
$$;
