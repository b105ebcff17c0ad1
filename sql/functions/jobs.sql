-- The job queue (siwa.jobs), river's `river_job.sql`: every statement that writes the table is in
-- this file, each in a named function (deploy/check/ownership.txt). First what the other files
-- call to queue, count, cancel or prune a job (the account rules, webhooks, retention); then the
-- queue's own machinery: queueing triggers, backoff, claim, completion, failure, the notification
-- hot path.
-- Applied after the numbered migrations whenever this file changes (see sql/README.md).

-- An authorization code's exchange at Apple (codes live five minutes, single use): first in the
-- queue, eight attempts. p_args: `app_user_id` and `code` for a link (siwa.link_account), `code`
-- and `purpose` `deletion` for a deletion's code (siwa.request_deletion_one). Returns the job's id.
CREATE OR REPLACE FUNCTION siwa.queue_exchange(p_client_id text, p_sub text, p_args jsonb) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    job_id bigint;
BEGIN
    INSERT INTO siwa.jobs (kind, priority, client_id, sub, args, max_attempts, run_at)
    VALUES ('exchange', 0, p_client_id, p_sub, p_args, 8, now())
    RETURNING id INTO job_id;
    RETURN job_id;
END
$$;

-- A revoke at Apple, retried for as long as it takes (a pending deletion is never dropped).
-- p_args `{}`: a deletion's revoke (siwa.request_deletion_one); `{"late_token": true}`: the tokens
-- found after a finished deletion (siwa.account_linked, siwa.account_imported). Returns the job's id.
CREATE OR REPLACE FUNCTION siwa.queue_revoke(p_client_id text, p_sub text, p_args jsonb) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    job_id bigint;
BEGIN
    INSERT INTO siwa.jobs (kind, priority, client_id, sub, max_attempts, args)
    VALUES ('revoke', 1, p_client_id, p_sub, 2147483647, p_args)
    RETURNING id INTO job_id;
    RETURN job_id;
END
$$;

-- Every refresh token Apple gives us is held by an account or revoked: this is the revoke of one
-- that no account keeps (a deletion's code after a new life began, an import older than a grant
-- end, the older tokens an ending event discards, a sign-in that failed after its exchange). A
-- `revoke` job of its own, retried like any revoke until Apple answers 200 (siwa.revoke_step:
-- `late_token`, so no deletion takes it for its own). p_token_enc is sealed for (p_client_id,
-- p_sub) and travels in the job's args (ciphertext: the console and the CLI never show args).
CREATE OR REPLACE FUNCTION siwa.revoke_token_later(p_client_id text, p_sub text, p_token_enc bytea, p_reason text)
RETURNS bigint
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO siwa.jobs (kind, priority, client_id, sub, max_attempts, args)
    VALUES ('revoke', 1, p_client_id, p_sub, 2147483647,
            jsonb_build_object('late_token', true, 'token_enc', encode(p_token_enc, 'base64'), 'reason', p_reason))
    RETURNING id
$$;

-- siwa.revoke_token_later for many tokens in one INSERT, in the arrays' order (token i of the
-- account p_client_ids[i], p_subs[i]): one statement, so one firing of the queue's wake-up trigger
-- for all of them (the notification batch's ending events: a call per token fired it per token, a
-- tenth of PostgreSQL's time on mix (b) of deploy/bench/worker.sh). Returns how many it queued.
CREATE OR REPLACE FUNCTION siwa.revoke_tokens_later(
    p_client_ids text[], p_subs text[], p_tokens_enc bytea[], p_reason text
) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    queued integer;
BEGIN
    IF coalesce(cardinality(p_tokens_enc), 0) = 0 THEN
        RETURN 0;  -- no statement, so no trigger firing, for a batch without ending events
    END IF;
    INSERT INTO siwa.jobs (kind, priority, client_id, sub, max_attempts, args)
    SELECT 'revoke', 1, u.client_id, u.sub, 2147483647,
           jsonb_build_object('late_token', true, 'token_enc', encode(u.token_enc, 'base64'), 'reason', p_reason)
      FROM unnest(p_client_ids, p_subs, p_tokens_enc) WITH ORDINALITY AS u(client_id, sub, token_enc, ord)
     ORDER BY u.ord;
    GET DIAGNOSTICS queued = ROW_COUNT;
    RETURN queued;
END
$$;

-- A revoke job counts the tokens Apple accepted for it (`args.revoked`, siwa.revoke_succeeded):
-- its deletion's reason is `revoked` when any was, else `no_token` (siwa.revoke_step).
CREATE OR REPLACE FUNCTION siwa.count_token_revoked(p_job_id bigint) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE siwa.jobs SET args = jsonb_set(args, '{revoked}', to_jsonb(coalesce((args->>'revoked')::integer, 0) + 1))
     WHERE id = p_job_id;
END
$$;

-- Reconciliation's schedule (opt-in, SIWA_RECONCILE_*): `reconcile` jobs for up to p_limit
-- accounts due (siwa.reconcile_skip: active, holding a token not checked with Apple in the last 24
-- hours), least recently checked first, never two open reconciles for one account. Returns how
-- many it queued.
CREATE OR REPLACE FUNCTION siwa.queue_reconciles(p_limit integer) RETURNS integer
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    WITH queued AS (
        INSERT INTO siwa.jobs (kind, priority, client_id, sub, max_attempts)
        SELECT 'reconcile', 3, a.client_id, a.sub, 5 FROM siwa.accounts a
         WHERE siwa.reconcile_skip(a.status, a.refresh_token_enc, a.token_checked_at) IS NULL
           AND NOT EXISTS (SELECT 1 FROM siwa.jobs j
                            WHERE j.client_id = a.client_id AND j.sub = a.sub AND j.kind = 'reconcile'
                              AND j.state IN ('available', 'running'))
         ORDER BY a.token_checked_at NULLS FIRST
         LIMIT p_limit
        RETURNING 1
    )
    SELECT count(*)::integer FROM queued
$$;

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
--     (jobs.sql) says, from the failures so far and the first one's time: `available` at the
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

-- `siwa webhooks disable` (siwa.disable_webhooks, webhooks.sql): the queued (available or
-- discarded) deliveries are cancelled, kept with outcome `webhooks_disabled`. Returns how many.
CREATE OR REPLACE FUNCTION siwa.cancel_webhook_deliveries() RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    cancelled integer;
BEGIN
    UPDATE siwa.jobs SET state = 'cancelled', outcome = 'webhooks_disabled', finalized_at = now(),
           locked_by = NULL, locked_until = NULL
     WHERE kind = 'webhook' AND state IN ('available', 'discarded');
    GET DIAGNOSTICS cancelled = ROW_COUNT;
    RETURN cancelled;
END
$$;

-- Retention (siwa.prune_notifications, notifications.sql): the completed or cancelled jobs of the
-- notifications p_jtis, pruned with them. Returns how many it deleted.
CREATE OR REPLACE FUNCTION siwa.prune_notification_jobs(p_jtis text[]) RETURNS integer
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    WITH pruned AS (
        DELETE FROM siwa.jobs WHERE notification_jti = ANY (p_jtis) AND state IN ('completed', 'cancelled')
        RETURNING 1
    )
    SELECT count(*)::integer FROM pruned
$$;

-- Privileges of the functions above (the queue's own are granted at the end of the file). The
-- trigger function too, as 003 grants every function of the schema to the worker (a trigger's
-- EXECUTE is not checked when it fires; this keeps 003 re-runnable unchanged).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_worker') THEN
        GRANT EXECUTE ON FUNCTION
            siwa.queue_exchange(text, text, jsonb), siwa.queue_revoke(text, text, jsonb),
            siwa.revoke_token_later(text, text, bytea, text), siwa.revoke_tokens_later(text[], text[], bytea[], text),
            siwa.count_token_revoked(bigint),
            siwa.queue_reconciles(integer),
            siwa.queue_webhook_deliveries(), siwa.claim_webhook_deliveries(text, integer, double precision),
            siwa.finish_webhook_deliveries(bigint[], bigint[], integer[], text[],
                                           double precision, double precision, double precision),
            siwa.extend_webhook_leases(bigint[], bigint[], double precision),
            siwa.release_webhook_deliveries(bigint[], bigint[]), siwa.cancel_webhook_deliveries(),
            siwa.prune_notification_jobs(text[])
           TO siwa_worker;
    END IF;
END
$$;

-- A notification's job is written by the same statement that stores the notification, so the
-- receiver's one INSERT commits both or neither. A statement trigger with a transition table
-- queues a whole batch in one INSERT; ON CONFLICT DO NOTHING keeps duplicates out of it.
-- It runs as its owner: the receiver's role may not write siwa.jobs itself (006_hardening.sql), so
-- the only job it can cause is the one for a notification it stores. When the session is a
-- siwa_receiver login (not a superuser), the job is held (run_at infinity) until a worker has
-- verified the stored jws against Apple's keys and the columns against its claims
-- (WorkerCore/StoredNotificationGate.swift): a compromised receiver can store rows, never have
-- them applied.
CREATE OR REPLACE FUNCTION siwa.queue_notification_jobs() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    held boolean;
BEGIN
    -- In this order (CASE, not AND): pg_has_role raises for a role that does not exist.
    held := CASE
        WHEN NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_receiver') THEN false
        WHEN (SELECT rolsuper FROM pg_roles WHERE rolname = session_user) THEN false
        ELSE pg_has_role(session_user, 'siwa_receiver', 'MEMBER') END;
    INSERT INTO siwa.jobs (kind, priority, client_id, sub, notification_jti, run_at)
    SELECT 'notification', 2, client_id, sub, jti,
           CASE WHEN coalesce(held, false) THEN 'infinity'::timestamptz ELSE now() END
      FROM new_notifications ORDER BY event_time, jti;
    RETURN NULL;
END
$$;

-- One wake-up per statement, not per job: listeners claim in batches anyway. The payload says
-- which of a worker's loops have work: the number of new notification jobs (so a worker can size
-- its claim), then `calls` if Apple-calling jobs were queued and `webhooks` if deliveries were:
-- `12`, `0 webhooks`, `0 calls`. Waking every loop on every statement made each notification
-- stored cost a claim of Apple-calling jobs as well, found empty (deploy/bench/worker.sh, steady
-- rate). A worker that cannot read a payload wakes every loop (what workers before this did).
CREATE OR REPLACE FUNCTION siwa.wake_workers() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    notifications bigint;
    calls bigint;
    webhooks bigint;
BEGIN
    SELECT count(*) FILTER (WHERE kind = 'notification'), count(*) FILTER (WHERE kind = 'webhook'),
           count(*) FILTER (WHERE kind NOT IN ('notification', 'webhook'))
      INTO notifications, webhooks, calls FROM new_jobs;
    IF notifications + webhooks + calls > 0 THEN
        PERFORM pg_notify('siwa_jobs', concat_ws(' ', notifications, CASE WHEN calls > 0 THEN 'calls' END,
                                                 CASE WHEN webhooks > 0 THEN 'webhooks' END));
    END IF;
    RETURN NULL;
END
$$;

-- Full-jitter exponential backoff, the same rule as JobQueue's RetryPolicy:
-- uniform in [0, min(cap, base * 2^(failures - 1))] seconds.
CREATE OR REPLACE FUNCTION siwa.job_backoff(p_failures integer, p_base double precision, p_cap double precision)
RETURNS interval
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
    SELECT make_interval(secs => random() * least(p_cap, p_base * power(2, least(greatest(p_failures, 1) - 1, 60))))
$$;

-- The one way a job completes: state `completed` with its outcome, finalized now, no lease, no
-- authorization code kept (a link's is spent or dead), due no later than now (a held
-- notification's `infinity` goes, so retention sees it). Fenced job by job with p_attempts, the
-- attempt the caller's lease holds:
--   p_row_locked = false: a leased job (claimed: state `running`) completes only while that
--     attempt is still the job's (a rescue or another worker's claim moved it on);
--   p_row_locked = true: a notification job, whose lease is its batch's row lock (state
--     `available`, siwa.run_notification_batch), completes at the attempt the batch read, and its
--     completion grows it (the job row is written once);
--   an attempt NULL (or p_attempts shorter than p_ids): unfenced, the caller holds the job's row lock and decided (an exchange's
--     success, the code spent at Apple; the gate's forged notifications; a step checked first).
-- Returns the ids completed.
CREATE OR REPLACE FUNCTION siwa.complete_jobs(
    p_ids bigint[], p_attempts integer[], p_outcomes text[], p_row_locked boolean DEFAULT false
) RETURNS SETOF bigint
LANGUAGE plpgsql
SET enable_seqscan = off SET plan_cache_mode = force_generic_plan
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN QUERY
    UPDATE siwa.jobs j
       SET state = 'completed', outcome = u.outcome, finalized_at = now(), run_at = least(j.run_at, now()),
           attempt = CASE WHEN p_row_locked AND u.attempt IS NOT NULL THEN j.attempt + 1 ELSE j.attempt END,
           args = j.args - 'code', locked_by = NULL, locked_until = NULL
      FROM unnest(p_ids, p_attempts, p_outcomes) AS u(id, attempt, outcome)
     WHERE j.id = u.id
       AND (u.attempt IS NULL
            OR (j.attempt = u.attempt AND j.state = CASE WHEN p_row_locked THEN 'available' ELSE 'running' END))
    RETURNING j.id;
END
$$;

-- What a failure does to a job, the one rule (the Apple-calling jobs through siwa.fail_jobs, the
-- notification batch's failures, and a process that died running it, siwa.rescue_expired_jobs):
-- the p_failures-th failure (this one included) of a job allowed p_max_attempts is the last when
-- it reaches them: `discarded`, kept for an operator's `siwa jobs retry`, its run_at left as it
-- was (p_run_at). Before that: `available` again after the full-jitter backoff
-- (siwa.job_backoff(p_failures, p_base, p_cap)), never sooner than p_retry_after seconds (Apple's
-- Retry-After is a floor, never a reason to retry sooner; NULL: none). A failure that cannot succeed
-- by retrying passes p_max_attempts 0. Tests/IntegrationTests/JobRetryTableTests.swift is its table.
CREATE OR REPLACE FUNCTION siwa.job_retry(
    p_failures integer, p_max_attempts integer, p_retry_after double precision,
    p_base double precision, p_cap double precision, p_run_at timestamptz,
    OUT state text, OUT run_at timestamptz
) LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN p_failures >= p_max_attempts THEN 'discarded' ELSE 'available' END,
           CASE WHEN p_failures >= p_max_attempts THEN p_run_at
                ELSE now() + greatest(make_interval(secs => coalesce(p_retry_after, 0)),
                                      siwa.job_backoff(p_failures, p_base, p_cap)) END
$$;

-- What a failed webhook delivery does, the one rule for deliveries (siwa.finish_webhook_deliveries
-- in webhooks.sql asks it): deliveries end by time, not by count (README.md, "Webhooks to the app":
-- retried with backoff for 24 h, then discarded and kept). p_failures counts this failure, and
-- p_first_failed_at is when the first recorded one happened (NULL: this is the first). Discarded,
-- its run_at kept (p_run_at), once p_window_seconds have passed since the first failure, now()
-- included; the first failure never discards, however long the change waited behind others.
-- Otherwise `available` after siwa.job_retry's backoff (the same arithmetic as every job's), never
-- scheduled past the window's end: the last retry lands there, and its failure discards.
-- Tests/IntegrationTests/WebhookRetryTableTests.swift is its table.
CREATE OR REPLACE FUNCTION siwa.webhook_retry(
    p_failures integer, p_first_failed_at timestamptz, p_window_seconds double precision,
    p_base double precision, p_cap double precision, p_run_at timestamptz,
    OUT state text, OUT run_at timestamptz
) LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
    SELECT r.state,
           CASE WHEN r.state = 'available' AND p_first_failed_at IS NOT NULL
                THEN least(r.run_at, greatest(now(), p_first_failed_at + make_interval(secs => p_window_seconds)))
                ELSE r.run_at END
      FROM siwa.job_retry(p_failures,
                          -- the window over: no attempt left (job_retry's discard); else no count ends it
                          CASE WHEN now() - p_first_failed_at >= make_interval(secs => p_window_seconds) THEN 0
                               ELSE 2147483647 END,
                          NULL, p_base, p_cap, p_run_at) r
$$;

-- The one way a job fails: its error appended to `errors` (with the attempt and the time), then
-- what siwa.job_retry says for its failures so far (`errors`, this one included) and its
-- max_attempts: back to `available` at the run_at it gives (p_retry_after a floor, NULL none), or
-- `discarded` for good (finalized now, kept for an operator's `siwa jobs retry`; an exchange keeps
-- no code, dead in minutes anyway). p_discard: the caller knows retrying cannot help (bad
-- arguments), discarded at once. No lease is left. Fenced as siwa.complete_jobs is (p_row_locked:
-- the batch's row lock, whose write grows the attempt). Returns each job written, its state and
-- run_at, and how many seconds from now that is (0 when discarded), for the caller's metrics and logs.
DROP FUNCTION IF EXISTS siwa.fail_jobs(bigint[], integer[], text[], double precision[], boolean[], boolean);
CREATE OR REPLACE FUNCTION siwa.fail_jobs(
    p_ids bigint[], p_attempts integer[], p_errors text[], p_retry_after double precision[], p_discard boolean[],
    p_base double precision, p_cap double precision, p_row_locked boolean DEFAULT false
) RETURNS TABLE (id bigint, state text, run_at timestamptz, retry_in double precision)
LANGUAGE plpgsql
SET enable_seqscan = off SET plan_cache_mode = force_generic_plan
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH failed AS (
        SELECT j.id, j.attempt, u.error,
               siwa.job_retry(jsonb_array_length(j.errors) + 1,
                              CASE WHEN coalesce(u.discard, false) THEN 0 ELSE j.max_attempts END,
                              u.retry_after, p_base, p_cap, j.run_at) AS next
          FROM unnest(p_ids, p_attempts, p_errors, p_retry_after, p_discard) AS u(id, attempt, error, retry_after, discard)
          JOIN siwa.jobs j ON j.id = u.id
         WHERE j.attempt = u.attempt AND j.state = CASE WHEN p_row_locked THEN 'available' ELSE 'running' END
    )
    UPDATE siwa.jobs j
       SET errors = j.errors || jsonb_build_array(jsonb_build_object('attempt', j.attempt, 'at', now(), 'error', f.error)),
           state = (f.next).state,
           run_at = (f.next).run_at,
           finalized_at = CASE WHEN (f.next).state = 'discarded' THEN now() END,
           args = CASE WHEN (f.next).state = 'discarded' THEN j.args - 'code' ELSE j.args END,
           attempt = CASE WHEN p_row_locked THEN j.attempt + 1 ELSE j.attempt END,
           locked_by = NULL, locked_until = NULL
      FROM failed f
     WHERE j.id = f.id AND j.attempt = f.attempt
       AND j.state = CASE WHEN p_row_locked THEN 'available' ELSE 'running' END
    RETURNING j.id, j.state, j.run_at,
              CASE WHEN j.state = 'discarded' THEN 0 ELSE extract(epoch FROM j.run_at - now())::float8 END;
END
$$;

-- One job: siwa.complete_jobs for it. Returns whether it completed (false: the fence did not hold).
CREATE OR REPLACE FUNCTION siwa.complete_job(p_job_id bigint, p_attempt integer, p_outcome text) RETURNS boolean
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM siwa.complete_jobs(ARRAY[p_job_id], ARRAY[p_attempt], ARRAY[p_outcome]))
$$;

-- The worker's other two statements that run with every batch or wake-up, as functions so each is
-- planned once per session (force_generic_plan). Sent as plain statements they were planned on
-- every call, about 0.4 ms each, most of it the planner reading the end of the claim index to
-- estimate `run_at <= now()` or `>= 'infinity'` against rows the statistics do not know yet: at
-- 1,000 notifications/s, a quarter of a core (deploy/bench/worker.sh DELAY_PROFILE=1).

-- Claims up to p_limit due jobs of the Apple-calling kinds (everything but `notification` and
-- `webhook`, which have claims of their own), oldest first by (priority, run_at, id), skipping rows
-- other workers hold and jobs of paused client IDs. The lease: state `running`, `attempt` grown
-- (the fencing token of every later write), `locked_until` now + p_lease_seconds.
CREATE OR REPLACE FUNCTION siwa.claim_call_jobs(p_worker text, p_limit integer, p_lease_seconds double precision)
RETURNS TABLE (id bigint, kind text, client_id text, sub text, notification_jti text, args text, attempt integer,
               max_attempts integer, error_count integer, created_at timestamptz)
LANGUAGE plpgsql
SET enable_seqscan = off SET plan_cache_mode = force_generic_plan
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE siwa.jobs j
       SET state = 'running', attempt = j.attempt + 1, locked_by = p_worker,
           locked_until = now() + make_interval(secs => p_lease_seconds)
      FROM (SELECT c.id FROM siwa.jobs c
             WHERE c.state = 'available' AND c.kind NOT IN ('notification', 'webhook') AND c.run_at <= now()
               AND NOT EXISTS (SELECT 1 FROM siwa.paused_clients p
                                WHERE p.client_id = c.client_id AND p.next_probe_at > now())
             ORDER BY c.priority, c.run_at, c.id
             LIMIT p_limit
               FOR UPDATE OF c SKIP LOCKED) due
     WHERE j.id = due.id
    RETURNING j.id, j.kind, j.client_id, j.sub, j.notification_jti, j.args::text, j.attempt, j.max_attempts,
              jsonb_array_length(j.errors), j.created_at;
END
$$;

-- Up to p_limit held notification jobs (stored by a siwa_receiver login, run_at infinity, see
-- siwa.queue_notification_jobs), locked SKIP LOCKED in the caller's transaction, with every
-- column the worker's gate checks and the jws, oldest first (WorkerCore/StoredNotificationGate.swift).
-- `run_at >= 'infinity'` (the same rows as `=`) and the claim index's order: with `=` and
-- `ORDER BY id`, the planner may walk the primary key past every completed job, a cost that grows
-- with the queue's history (6-10 ms a batch with 18,000 completed, 0.3 ms this way).
--
-- Each job's notification is a scalar subquery on purpose, so it is always a lookup by jti: written
-- as a join, a session that planned it while the tables were analyzed empty kept a nested loop
-- walking the whole notifications index once per job (the plan is kept for the session; the
-- next ANALYZE can be a minute away). In deploy/bench/worker.sh's steady run that made each batch
-- of 250 take 3-9 s (819,062 buffers a read with 2,281 notifications, auto_explain) until
-- autovacuum's ANALYZE, and every effect of the run 60 s late.
--
-- p_skip_busy_accounts: take only jobs of users no other batch is taking. Each job's user (its
-- sub: a sub names one user across an app group's client IDs) is claimed with a transaction-scoped
-- advisory lock, class 1936291681 ('siwa'), keyed by hashtext(sub); a job whose user another batch
-- claimed is left for a later batch instead of being read, verified and then deferred because the
-- account row is busy (siwa.apply_notifications). The account row locks stay what decides; this
-- only keeps concurrent batches apart. With hot accounts (mix (c) of deploy/bench/worker.sh, two
-- worker processes) it took deferrals from 5,400 of 20,000 jobs to none. The worker asks for it
-- only while its batches meet busy accounts: each claimed user is one entry in PostgreSQL's lock
-- table (max_locks_per_transaction x max_connections entries), and batches of distinct users,
-- the usual load, do not need it.
CREATE OR REPLACE FUNCTION siwa.held_notification_jobs(p_limit integer, p_skip_busy_accounts boolean DEFAULT false)
RETURNS TABLE (id bigint, jti text, client_id text, sub text, event_type text, event_ms bigint, email text,
               is_private_email boolean, jws text)
LANGUAGE plpgsql
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
    -- The notification is read once its job is locked, outside the locking subquery: read inside
    -- it, it was read (the whole row, jws and claims) for every job scanned, the ones other batches
    -- hold and SKIP LOCKED then passes over too, which with 2 worker processes are most of those
    -- scanned (deploy/bench/worker.sh: this read's time per job doubled from 1 process to 2).
    -- LATERAL with OFFSET 0: a key probe per locked job whatever the plan; a plain join planned on
    -- an empty queue walked the whole notifications index instead (WorkerTests,
    -- heldReadAndBatchPlannedOnAnEmptyQueueReadTheirBatchAsItFills).
    RETURN QUERY
    SELECT h.id, n.jti, n.client_id, n.sub, n.event_type,
           round(extract(epoch FROM n.event_time) * 1000)::int8, n.email, n.is_private_email, n.jws
      FROM (SELECT j.id, j.priority, j.run_at, j.notification_jti
              FROM siwa.jobs j
             WHERE j.state = 'available' AND j.priority = 2 AND j.run_at >= 'infinity' AND j.kind = 'notification'
               AND (NOT p_skip_busy_accounts OR pg_try_advisory_xact_lock(1936291681, hashtext(j.sub)))
             ORDER BY j.priority, j.run_at, j.id
             LIMIT p_limit
               FOR UPDATE OF j SKIP LOCKED) h
      JOIN LATERAL (SELECT n.* FROM siwa.notifications n WHERE n.jti = h.notification_jti OFFSET 0) n ON true
     ORDER BY h.priority, h.run_at, h.id;
END
$$;

-- Held notification jobs the worker's gate refused (their jws or columns do not verify, see
-- siwa.held_notification_jobs), locked by the caller: each notification is recorded `forged`,
-- never applied, and its job completed with that outcome. Returns how many jobs completed.
CREATE OR REPLACE FUNCTION siwa.forged_notifications(p_job_ids bigint[]) RETURNS integer
LANGUAGE plpgsql
SET enable_seqscan = off SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM siwa.notifications_forged(p_job_ids);
    RETURN (SELECT count(*)
              FROM siwa.complete_jobs(p_job_ids, '{}', array_fill('forged'::text, ARRAY[cardinality(p_job_ids)])));
END
$$;

-- Claims up to p_limit due notification jobs (FOR UPDATE SKIP LOCKED), applies them and completes
-- them, all in the caller's transaction. p_worker and p_lease_seconds are unused: the row lock is
-- the lease (kept in the signature for callers).
-- p_verified: held jobs (run_at infinity, see siwa.queue_notification_jobs) the caller has locked
-- in this same transaction and verified (WorkerCore/StoredNotificationGate.swift). They are taken
-- first, and due jobs fill the rest of p_limit: a held job is released and applied in one
-- transaction, never written twice, and a rollback leaves it held, to be verified again.
-- p_isolate = false: the whole batch with siwa.apply_notifications, set-based, no subtransactions
-- (fast path; any error aborts the whole batch, the caller retries with p_isolate = true).
-- p_isolate = true: each job with siwa.apply_notification in its own subtransaction, in
-- event_time order; a job that raises is failed with backoff (or discarded at max_attempts) and
-- the rest commit. Returns one row per claimed job (state `completed`, `available` after a failure,
-- `discarded`, `lost` when the fence did not match, or `deferred`: left queued, its account busy).
-- p_skip_busy_accounts: due jobs only of users no other batch is taking, with the advisory lock
-- siwa.held_notification_jobs takes (the caller asks for both or neither). A held job deferred
-- because its account was busy is released as a due job; claimed without the lock, it met the
-- batch that held its account again, was deferred again, and the deferrals halved the batches of
-- both (mix (c) of deploy/bench/worker.sh with two processes: ~3,100 of 20,000 jobs deferred,
-- batches of 81 against one process's 204).
-- (Before p_verified the signature had six arguments, before p_skip_busy_accounts seven; a call
-- with six or seven still resolves to this one.)
DROP FUNCTION IF EXISTS siwa.run_notification_batch(text, integer, double precision, boolean, double precision, double precision);
DROP FUNCTION IF EXISTS siwa.run_notification_batch(text, integer, double precision, boolean, double precision, double precision, bigint[]);
CREATE OR REPLACE FUNCTION siwa.run_notification_batch(
    p_worker text, p_limit integer, p_lease_seconds double precision, p_isolate boolean,
    p_backoff_base double precision, p_backoff_cap double precision, p_verified bigint[] DEFAULT '{}',
    p_skip_busy_accounts boolean DEFAULT false
) RETURNS TABLE (job_id bigint, jti text, outcome text, error text, state text, delay_seconds double precision)
LANGUAGE plpgsql
-- Claim and completion are key-driven (the claim index in order, then primary keys), whatever
-- stale statistics would suggest. The plans are the same for every batch, so each statement here and
-- in the functions it calls is planned once per session (generic plan): a batch of one job spent
-- 40 % of its time re-planning (deploy/bench/worker.sh, CPU per batch).
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ids bigint[];
    jtis text[];
    attempts integer[];
    done_ids bigint[] := '{}';
    done_attempts integer[] := '{}';
    done_jtis text[] := '{}';
    job record;
    message text;
    final_state text;
BEGIN
    -- The row locks taken here are the lease: held until this transaction ends, so no other
    -- worker can take these jobs, and a crash rolls everything back (nothing half-applied, nothing
    -- stuck). Each job row is written once, by its completion, which also grows `attempt`.
    SELECT array_agg(d.id ORDER BY d.priority, d.run_at, d.id), array_agg(d.notification_jti ORDER BY d.priority, d.run_at, d.id),
           array_agg(d.attempt ORDER BY d.priority, d.run_at, d.id)
      INTO ids, jtis, attempts
      -- The verified jobs by primary key: their kind is checked outside the locking subquery
      -- (OFFSET 0 keeps the check from being pushed into it), so its WHERE does not match the
      -- claim index's predicate and no plan can walk that index with `id = ANY` as a filter (a
      -- session that planned it on a queue analyzed empty did, on every batch: 9,750 index
      -- entries read to find 250 verified jobs with 10,000 queued).
      FROM (SELECT v.id, v.notification_jti, v.attempt, v.priority, v.run_at
              FROM (SELECT j.id, j.notification_jti, j.attempt, j.priority, j.run_at, j.kind FROM siwa.jobs j
                     WHERE j.id = ANY(p_verified) AND j.state = 'available'
                       FOR UPDATE OFFSET 0) v  -- locked already, by the caller's verification
             WHERE v.kind = 'notification'
            UNION ALL
            SELECT due.* FROM (SELECT j.id, j.notification_jti, j.attempt, j.priority, j.run_at FROM siwa.jobs j
                                WHERE j.state = 'available' AND j.kind = 'notification' AND j.run_at <= now()
                                  AND (NOT p_skip_busy_accounts OR pg_try_advisory_xact_lock(1936291681, hashtext(j.sub)))
                                ORDER BY j.priority, j.run_at, j.id
                                LIMIT greatest(p_limit - coalesce(cardinality(p_verified), 0), 0)
                                  FOR UPDATE SKIP LOCKED) due) d;

    IF ids IS NULL THEN
        RETURN;
    END IF;

    IF p_isolate THEN
        FOR job IN
            SELECT u.id, u.jti, u.attempt
              FROM unnest(ids, jtis, attempts) WITH ORDINALITY AS u(id, jti, attempt, ord)
              LEFT JOIN siwa.notifications n ON n.jti = u.jti
             ORDER BY n.event_time, u.ord
        LOOP
            BEGIN
                PERFORM siwa.apply_notification(job.jti, job.id);
            EXCEPTION WHEN OTHERS THEN
                message := SQLERRM;
                -- Retried after the backoff, or discarded at max_attempts: siwa.job_retry decides.
                SELECT f.state INTO final_state
                  FROM siwa.fail_jobs(ARRAY[job.id], ARRAY[job.attempt], ARRAY[message], ARRAY[NULL::float8],
                                      ARRAY[false], p_backoff_base, p_backoff_cap, true) f;
                job_id := job.id; jti := job.jti; outcome := NULL; error := message;
                state := coalesce(final_state, 'lost'); delay_seconds := NULL;
                RETURN NEXT;
                CONTINUE;
            END;
            done_ids := done_ids || job.id;
            done_attempts := done_attempts || job.attempt;
            done_jtis := done_jtis || job.jti;
        END LOOP;
    ELSE
        PERFORM siwa.apply_notifications(jtis, ids);
        done_ids := ids;
        done_attempts := attempts;
        done_jtis := jtis;
    END IF;

    -- Completion, fenced by the row lock and by state and attempt as read at the claim. The
    -- outcome is the one recorded on the notification (`missing`: pruned before it ran). A job
    -- whose notification is still unprocessed was deferred (its account was busy, see
    -- siwa.apply_notifications): it stays queued as it was, written only to release it if it was
    -- a verified held job (so it is not verified again), and is reported `deferred`.
    RETURN QUERY
    WITH d AS (
        SELECT u.id, u.attempt, u.jti, coalesce(n.outcome, 'missing') AS outcome, n.received_at,
               n.jti IS NOT NULL AND n.processed_at IS NULL AS deferred
          FROM unnest(done_ids, done_attempts, done_jtis) AS u(id, attempt, jti)
          LEFT JOIN siwa.notifications n ON n.jti = u.jti
    ), done AS (
        SELECT c.id FROM siwa.complete_jobs(
            ARRAY(SELECT d.id FROM d WHERE NOT d.deferred ORDER BY d.id),
            ARRAY(SELECT d.attempt FROM d WHERE NOT d.deferred ORDER BY d.id),
            ARRAY(SELECT d.outcome FROM d WHERE NOT d.deferred ORDER BY d.id), true) AS c(id)
    ), completed AS (
        -- A membership test against the array, not a join: with hash and merge joins off, a join of
        -- two CTE scans is a nested loop reading `done` once per job (250 x 250 rows, a third of
        -- this statement's time in deploy/bench/worker.sh's profile).
        SELECT d.id, d.jti AS notification_jti, d.outcome, d.received_at
          FROM d WHERE NOT d.deferred AND d.id = ANY (ARRAY(SELECT done.id FROM done))
    ), released AS (
        UPDATE siwa.jobs j SET run_at = now()
          FROM d
         WHERE j.id = d.id AND d.deferred AND j.state = 'available' AND j.run_at = 'infinity'
    )
    SELECT c.id, c.notification_jti, c.outcome, NULL::text, 'completed'::text,
           extract(epoch FROM clock_timestamp() - c.received_at)::double precision
      FROM completed c
    UNION ALL
    SELECT d.id, d.jti, NULL::text, NULL::text, 'deferred'::text, NULL::double precision
      FROM d WHERE d.deferred;
END
$$;

-- Jobs whose lease ran out with no outcome recorded (their worker died, or hung past its lease)
-- go back to the queue, due now; the next claim grows `attempt`, which fences the first worker
-- out. Each such rescue counts in `expired_leases` (sql/015_process_died.sql), and the third
-- discards the job instead, kept with the error `process_died`, so a job that kills every process
-- running it stops taking the workers down. Unlike a failure's discard, an exchange keeps its
-- code: `siwa jobs retry` is the remedy here, and Apple refuses the code itself once it expires.
-- Any worker may run this. Returns each job rescued and the state it got.
CREATE OR REPLACE FUNCTION siwa.rescue_expired_jobs()
RETURNS TABLE (job_id bigint, kind text, state text)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH expired AS (
        SELECT j.id FROM siwa.jobs j
         WHERE j.state = 'running' AND j.locked_until < now()
           FOR UPDATE SKIP LOCKED
    ), rescued AS (
        -- A death is a failure of siwa.job_retry's rule with three allowed and no backoff (due now);
        -- only the last one is recorded in `errors` (which counts the other failures).
        UPDATE siwa.jobs j
           SET expired_leases = j.expired_leases + 1,
               state = (r.next).state,
               errors = CASE WHEN (r.next).state = 'discarded'
                             THEN j.errors || jsonb_build_array(jsonb_build_object(
                                      'attempt', j.attempt, 'at', now(), 'error', 'process_died'))
                             ELSE j.errors END,
               finalized_at = CASE WHEN (r.next).state = 'discarded' THEN now() END,
               run_at = (r.next).run_at,
               locked_by = NULL, locked_until = NULL
          FROM (SELECT e.id, siwa.job_retry(x.expired_leases + 1, 3, NULL, 0, 0, x.run_at) AS next
                  FROM expired e JOIN siwa.jobs x ON x.id = e.id) r
         WHERE j.id = r.id
        RETURNING j.id, j.kind, j.state
    )
    SELECT r.id, r.kind, r.state FROM rescued r ORDER BY r.id;
END
$$;

-- Privileges. Functions are executable by PUBLIC when created, and 003's schema-scoped
-- ALTER DEFAULT PRIVILEGES cannot take away that global default: revoke it explicitly.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA siwa FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_worker') THEN
        GRANT EXECUTE ON FUNCTION siwa.job_backoff(integer, double precision, double precision),
                                  siwa.complete_jobs(bigint[], integer[], text[], boolean),
                                  siwa.complete_job(bigint, integer, text),
                                  siwa.job_retry(integer, integer, double precision, double precision, double precision, timestamptz),
                                  siwa.webhook_retry(integer, timestamptz, double precision, double precision,
                                                     double precision, timestamptz),
                                  siwa.fail_jobs(bigint[], integer[], text[], double precision[], boolean[],
                                                 double precision, double precision, boolean),
                                  siwa.claim_call_jobs(text, integer, double precision),
                                  siwa.rescue_expired_jobs(),
                                  siwa.held_notification_jobs(integer, boolean), siwa.forged_notifications(bigint[]),
                                  siwa.run_notification_batch(text, integer, double precision, boolean,
                                                              double precision, double precision, bigint[], boolean)
           TO siwa_worker;
    END IF;
END
$$;

-- The statements JobQueue and JobAdministration used to write inline in Swift, named here so every
-- write of siwa.jobs is in this file (issue 39). Each is fenced as before: a leased job's write
-- matches only while its attempt is still the job's and it is `running`.

-- Back to `available` at now + p_seconds without recording an error (a handler's snooze).
-- Returns whether the fence held.
CREATE OR REPLACE FUNCTION siwa.snooze_job(p_job_id bigint, p_attempt integer, p_seconds double precision)
RETURNS boolean
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    WITH s AS (
        UPDATE siwa.jobs SET state = 'available', run_at = now() + make_interval(secs => p_seconds),
               locked_by = NULL, locked_until = NULL
         WHERE id = p_job_id AND state = 'running' AND attempt = p_attempt
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM s)
$$;

-- Heartbeat: locked_until = now + p_lease_seconds for the jobs (id, attempt) this worker still
-- holds. Returns how many it extended.
CREATE OR REPLACE FUNCTION siwa.extend_job_leases(p_ids bigint[], p_attempts bigint[], p_lease_seconds double precision)
RETURNS integer
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    WITH x AS (
        UPDATE siwa.jobs j SET locked_until = now() + make_interval(secs => p_lease_seconds)
          FROM unnest(p_ids, p_attempts) AS h(id, attempt)
         WHERE j.id = h.id AND j.state = 'running' AND j.attempt = h.attempt
        RETURNING 1
    )
    SELECT count(*)::integer FROM x
$$;

-- Shutdown: hands the jobs (id, attempt) this worker still holds back to the queue, due now, no
-- error recorded. Returns how many it released.
CREATE OR REPLACE FUNCTION siwa.release_jobs(p_ids bigint[], p_attempts bigint[]) RETURNS integer
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    WITH r AS (
        UPDATE siwa.jobs j SET state = 'available', run_at = now(), locked_by = NULL, locked_until = NULL
          FROM unnest(p_ids, p_attempts) AS h(id, attempt)
         WHERE j.id = h.id AND j.state = 'running' AND j.attempt = h.attempt
        RETURNING 1
    )
    SELECT count(*)::integer FROM r
$$;

-- Retention of the queue's own rows: deletes completed and cancelled jobs finalized more than
-- p_age_seconds ago, at most p_batch of them (the worker's retention pass). Returns how many.
CREATE OR REPLACE FUNCTION siwa.prune_completed_jobs(p_age_seconds double precision, p_batch integer)
RETURNS integer
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    WITH d AS (
        DELETE FROM siwa.jobs WHERE id IN (
            SELECT id FROM siwa.jobs
             WHERE finalized_at < now() - make_interval(secs => p_age_seconds)
               AND state IN ('completed', 'cancelled')
             LIMIT p_batch)
        RETURNING 1
    )
    SELECT count(*)::integer FROM d
$$;

-- `siwa jobs list` and the console: jobs matching every filter given (NULL: any), newest first,
-- with the last recorded error's text and whether each is a revoke guarding a pending deletion
-- (siwa.guards_pending_deletion).
CREATE OR REPLACE FUNCTION siwa.list_jobs(p_id bigint, p_state text, p_kind text, p_sub text, p_limit integer)
RETURNS TABLE (id bigint, kind text, state text, client_id text, sub text, attempt integer, max_attempts integer,
               error_count integer, last_error text, outcome text, run_at timestamptz, created_at timestamptz,
               finalized_at timestamptz, guards_pending_deletion boolean)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT j.id, j.kind, j.state, j.client_id, j.sub, j.attempt, j.max_attempts,
           jsonb_array_length(j.errors),
           CASE WHEN jsonb_array_length(j.errors) > 0
                THEN coalesce(j.errors -> -1 ->> 'error', (j.errors -> -1)::text) END,
           j.outcome, j.run_at, j.created_at, j.finalized_at,
           siwa.guards_pending_deletion(j.kind, j.client_id, j.sub)
      FROM siwa.jobs j
     WHERE (p_id IS NULL OR j.id = p_id)
       AND (p_state IS NULL OR j.state = p_state)
       AND (p_kind IS NULL OR j.kind = p_kind)
       AND (p_sub IS NULL OR j.sub = p_sub)
     ORDER BY j.id DESC
     LIMIT p_limit
$$;

-- `siwa jobs retry`: discarded jobs, and available ones waiting out a retry backoff, of the job
-- p_id or of every job of p_sub (and of p_kind when given), become available now. Errors are kept;
-- a job out of attempts gets one more; a `process_died` discard counts expired leases afresh.
-- Cancelled jobs are not retried. Returns each job retried and its kind.
CREATE OR REPLACE FUNCTION siwa.retry_jobs(p_id bigint, p_sub text, p_kind text)
RETURNS TABLE (id bigint, kind text)
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    UPDATE siwa.jobs j
       SET state = 'available', run_at = now(), finalized_at = NULL, outcome = NULL,
           locked_by = NULL, locked_until = NULL, expired_leases = 0,
           max_attempts = greatest(j.max_attempts, jsonb_array_length(j.errors) + 1)
     WHERE (p_id IS NULL OR j.id = p_id)
       AND (p_sub IS NULL OR j.sub = p_sub)
       AND (p_kind IS NULL OR j.kind = p_kind)
       AND (j.state = 'discarded' OR (j.state = 'available' AND jsonb_array_length(j.errors) > 0))
    RETURNING j.id, j.kind
$$;

-- `siwa jobs cancel`: the jobs of p_id or of p_sub (and of p_kind when given), locked in id order.
-- Those not final (available or running: a running job's worker then fails its fence) are
-- cancelled, except a revoke whose account is still pending_deletion, cancelled only with p_force
-- and then recorded in siwa.account_changes (`deletion_revoke_cancelled`) so it is never silent.
-- Returns every matched job with what became of it: `cancelled`, `cancelled_pending_deletion`,
-- `refused` (a guarding revoke without p_force) or `already_final`.
CREATE OR REPLACE FUNCTION siwa.cancel_jobs(p_id bigint, p_sub text, p_kind text, p_force boolean)
RETURNS TABLE (id bigint, kind text, result text)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    job record;
BEGIN
    FOR job IN
        SELECT j.id, j.kind, j.state, j.client_id, j.sub,
               siwa.guards_pending_deletion(j.kind, j.client_id, j.sub) AS guards
          FROM siwa.jobs j
         WHERE (p_id IS NULL OR j.id = p_id)
           AND (p_sub IS NULL OR j.sub = p_sub)
           AND (p_kind IS NULL OR j.kind = p_kind)
         ORDER BY j.id
           FOR UPDATE OF j
    LOOP
        id := job.id;
        kind := job.kind;
        IF job.state NOT IN ('available', 'running') THEN
            result := 'already_final';
        ELSIF job.guards AND NOT p_force THEN
            result := 'refused';
        ELSE
            UPDATE siwa.jobs
               SET state = 'cancelled', finalized_at = now(), locked_by = NULL, locked_until = NULL,
                   outcome = 'cancelled_by_operator', args = args - 'code'
             WHERE siwa.jobs.id = job.id;
            result := 'cancelled';
            IF job.guards THEN
                PERFORM siwa.record_change(job.client_id, job.sub, 'deletion_revoke_cancelled',
                                           'revoke job cancelled by an operator (--force)', NULL, job.id);
                result := 'cancelled_pending_deletion';
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;

REVOKE EXECUTE ON FUNCTION siwa.snooze_job(bigint, integer, double precision),
                           siwa.extend_job_leases(bigint[], bigint[], double precision),
                           siwa.release_jobs(bigint[], bigint[]),
                           siwa.prune_completed_jobs(double precision, integer),
                           siwa.list_jobs(bigint, text, text, text, integer),
                           siwa.retry_jobs(bigint, text, text),
                           siwa.cancel_jobs(bigint, text, text, boolean)
  FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_worker') THEN
        GRANT EXECUTE ON FUNCTION siwa.snooze_job(bigint, integer, double precision),
                                  siwa.extend_job_leases(bigint[], bigint[], double precision),
                                  siwa.release_jobs(bigint[], bigint[]),
                                  siwa.prune_completed_jobs(double precision, integer),
                                  -- the console (in the worker) lists, retries and cancels jobs
                                  siwa.list_jobs(bigint, text, text, text, integer),
                                  siwa.retry_jobs(bigint, text, text),
                                  siwa.cancel_jobs(bigint, text, text, boolean)
           TO siwa_worker;
    END IF;
END
$$;
