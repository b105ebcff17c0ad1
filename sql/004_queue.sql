-- Queue functions for siwa-worker (JobQueue). Notification jobs are claimed, applied and
-- completed inside one statement, so the hot path costs one round trip per batch; other kinds
-- are claimed with a lease and completed by the worker with the attempt as fencing token.

-- Claims are split by kind, each walking its own partial index in claim order: a backlog of one
-- kind never makes the other's claim scan past it, and ORDER BY ... LIMIT on a matching index
-- stays an index scan whatever the statistics say.
DROP INDEX IF EXISTS siwa.jobs_claim;
CREATE INDEX jobs_claim_notification ON siwa.jobs (priority, run_at, id)
    WHERE state = 'available' AND kind = 'notification';
CREATE INDEX jobs_claim_calls ON siwa.jobs (priority, run_at, id)
    WHERE state = 'available' AND kind <> 'notification';

-- Full-jitter exponential backoff, the same rule as JobQueue's RetryPolicy:
-- uniform in [0, min(cap, base * 2^(failures - 1))] seconds.
CREATE FUNCTION siwa.job_backoff(p_failures integer, p_base double precision, p_cap double precision)
RETURNS interval
LANGUAGE sql VOLATILE AS $$
    SELECT make_interval(secs => random() * least(p_cap, p_base * power(2, least(greatest(p_failures, 1) - 1, 60))))
$$;

-- Claims up to p_limit due notification jobs (FOR UPDATE SKIP LOCKED), applies each with
-- siwa.apply_notification and completes it, all in the caller's transaction. p_worker and
-- p_lease_seconds are unused: the row lock is the lease (kept in the signature for callers).
-- p_isolate = false: no subtransactions (fast path; any error aborts the whole batch, the caller
-- retries with p_isolate = true). p_isolate = true: each job in its own subtransaction; a job
-- that raises is failed with backoff (or discarded at max_attempts) and the rest commit.
-- Returns one row per claimed job.
CREATE FUNCTION siwa.run_notification_batch(
    p_worker text, p_limit integer, p_lease_seconds double precision, p_isolate boolean,
    p_backoff_base double precision, p_backoff_cap double precision
) RETURNS TABLE (job_id bigint, jti text, outcome text, error text, state text, delay_seconds double precision)
LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[];
    jtis text[];
    attempts integer[];
    done_ids bigint[] := '{}';
    done_attempts integer[] := '{}';
    done_outcomes text[] := '{}';
    i integer;
    result text;
    message text;
    final_state text;
BEGIN
    -- The row locks taken here are the lease: held until this transaction ends, so no other
    -- worker can take these jobs, and a crash rolls everything back (nothing half-applied, nothing
    -- stuck). Each job row is written once, by its completion, which also grows `attempt`.
    SELECT array_agg(d.id ORDER BY d.priority, d.run_at, d.id), array_agg(d.notification_jti ORDER BY d.priority, d.run_at, d.id),
           array_agg(d.attempt ORDER BY d.priority, d.run_at, d.id)
      INTO ids, jtis, attempts
      FROM (SELECT j.id, j.notification_jti, j.attempt, j.priority, j.run_at FROM siwa.jobs j
             WHERE j.state = 'available' AND j.kind = 'notification' AND j.run_at <= now()
             ORDER BY j.priority, j.run_at, j.id
             LIMIT p_limit
               FOR UPDATE SKIP LOCKED) d;

    IF ids IS NULL THEN
        RETURN;
    END IF;

    FOR i IN 1 .. array_length(ids, 1) LOOP
        IF p_isolate THEN
            BEGIN
                result := siwa.apply_notification(jtis[i], ids[i]);
            EXCEPTION WHEN OTHERS THEN
                message := SQLERRM;
                UPDATE siwa.jobs j
                   SET errors = j.errors || jsonb_build_array(jsonb_build_object(
                           'attempt', j.attempt, 'at', now(), 'error', message)),
                       state = CASE WHEN jsonb_array_length(j.errors) + 1 >= j.max_attempts
                                    THEN 'discarded' ELSE 'available' END,
                       run_at = now() + siwa.job_backoff(jsonb_array_length(j.errors) + 1, p_backoff_base, p_backoff_cap),
                       finalized_at = CASE WHEN jsonb_array_length(j.errors) + 1 >= j.max_attempts
                                           THEN now() END,
                       attempt = j.attempt + 1, locked_by = NULL, locked_until = NULL
                 WHERE j.id = ids[i] AND j.state = 'available' AND j.attempt = attempts[i]
                RETURNING j.state INTO final_state;
                job_id := ids[i]; jti := jtis[i]; outcome := NULL; error := message;
                state := coalesce(final_state, 'lost'); delay_seconds := NULL;
                RETURN NEXT;
                CONTINUE;
            END;
        ELSE
            result := siwa.apply_notification(jtis[i], ids[i]);
        END IF;
        done_ids := done_ids || ids[i];
        done_attempts := done_attempts || attempts[i];
        done_outcomes := done_outcomes || result;
    END LOOP;

    -- Completion, fenced by the row lock and by state and attempt as read at the claim.
    RETURN QUERY
    WITH d AS (
        SELECT * FROM unnest(done_ids, done_attempts, done_outcomes) AS d(id, attempt, outcome)
    ), completed AS (
        UPDATE siwa.jobs j
           SET state = 'completed', attempt = j.attempt + 1, outcome = d.outcome, finalized_at = now(),
               locked_by = NULL, locked_until = NULL
          FROM d
         WHERE j.id = d.id AND j.state = 'available' AND j.attempt = d.attempt
        RETURNING j.id, j.notification_jti, d.outcome
    )
    SELECT c.id, c.notification_jti, c.outcome, NULL::text, 'completed'::text,
           extract(epoch FROM clock_timestamp() - n.received_at)::double precision
      FROM completed c LEFT JOIN siwa.notifications n ON n.jti = c.notification_jti;
END
$$;

-- 003 granted EXECUTE on the functions that existed then; these are new.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'siwa_worker') THEN
        EXECUTE 'GRANT EXECUTE ON FUNCTION siwa.job_backoff(integer, double precision, double precision) TO siwa_worker';
        EXECUTE 'GRANT EXECUTE ON FUNCTION siwa.run_notification_batch(text, integer, double precision, boolean,
                 double precision, double precision) TO siwa_worker';
    END IF;
END
$$;
