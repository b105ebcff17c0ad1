-- Raw peer of the Apple-calling jobs of mix (d) (deploy/bench/worker.sh): what an exchange or revoke
-- job writes, without the HTTP call to Apple (there is no SQL for that): claim one job with a lease
-- (its own transaction, as the worker's claim), then in one transaction write the account (token
-- stored, or discarded at deletion), append the change row with its pg_notify, complete the job.
WITH u AS (
    UPDATE siwa.jobs j
       SET state = 'running', attempt = j.attempt + 1, locked_by = 'raw', locked_until = now() + interval '60 s'
      FROM (SELECT id FROM siwa.jobs
             WHERE state = 'available' AND kind <> 'notification' AND run_at <= now()
             ORDER BY priority, run_at, id
             LIMIT 1
               FOR UPDATE SKIP LOCKED) d
     WHERE j.id = d.id
    RETURNING j.id
)
SELECT coalesce(max(id), 0) AS jid FROM u
\gset
BEGIN;
WITH j AS (
    SELECT id, kind, client_id, sub, args FROM siwa.jobs WHERE id = :jid AND state = 'running'
), a AS (
    INSERT INTO siwa.accounts AS a (client_id, sub, app_user_id, status, refresh_token_enc, linked_at, updated_at)
    SELECT j.client_id, j.sub, j.args->>'app_user_id', CASE j.kind WHEN 'exchange' THEN 'active' ELSE 'deleted' END,
           CASE j.kind WHEN 'exchange' THEN decode(repeat('ab', 80), 'hex') END, now(), now()
      FROM j
    ON CONFLICT (client_id, sub) DO UPDATE
       SET status = excluded.status, refresh_token_enc = excluded.refresh_token_enc,
           app_user_id = coalesce(excluded.app_user_id, a.app_user_id),
           linked_at = CASE WHEN excluded.status = 'active' THEN now() ELSE a.linked_at END, updated_at = now()
    RETURNING a.client_id, a.sub, a.app_user_id, a.status
), ch AS (
    INSERT INTO siwa.account_changes (client_id, sub, app_user_id, change, status, job_id)
    SELECT a.client_id, a.sub, a.app_user_id, CASE a.status WHEN 'active' THEN 'linked' ELSE 'deleted' END, a.status, :jid
      FROM a
    RETURNING id, client_id, sub, change, status
), told AS (
    SELECT count(pg_notify('siwa_account_changes', json_build_object(
               'id', id, 'client_id', client_id, 'sub', sub, 'change', change, 'status', status)::text)) AS sent
      FROM ch
)
UPDATE siwa.jobs
   SET state = 'completed', outcome = 'done', args = args - 'code', finalized_at = now(), locked_by = NULL, locked_until = NULL
 WHERE id = :jid AND state = 'running' AND (SELECT sent FROM told) >= 0;
COMMIT;
