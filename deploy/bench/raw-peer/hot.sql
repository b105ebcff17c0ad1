-- Raw peer of mix (c), hot accounts (deploy/bench/worker.sh): 50 email events of accounts that get
-- 100 events each, out of order. The same writes as the worker, set-based: read 50 held jobs with what
-- verifying them needs (FOR UPDATE SKIP LOCKED), then in one statement
-- lock their accounts in key order, apply every event newer than the account's last email event
-- (stale ones are only marked processed), write each account once with its newest event, append one
-- change row with one pg_notify per applied event, complete the jobs. (The worker writes an account
-- once per applied event, in event_time order: the rows it leaves are the same.)
-- The notifications are stored by a siwa_receiver login, so their jobs are held until verified
-- (sql/functions/queue.sql); the RSA verification itself is the worker's CPU, not SQL.
BEGIN;
-- What the worker reads to verify the held notifications (StoredNotificationGate): 50 held jobs
-- locked SKIP LOCKED with every column it checks and the jws, all shipped to the client.
SELECT coalesce(array_agg(h.id), '{}') AS ids,
       string_agg(concat_ws('|', h.jti, h.client_id, h.sub, h.event_type, h.event_ms, h.email, h.is_private_email, h.jws), E'\n') AS held
  FROM (SELECT j.id, n.jti, n.client_id, n.sub, n.event_type, round(extract(epoch FROM n.event_time) * 1000)::int8 AS event_ms,
               n.email, n.is_private_email, n.jws
          FROM siwa.jobs j JOIN siwa.notifications n ON n.jti = j.notification_jti
         WHERE j.state = 'available' AND j.priority = 2 AND j.run_at >= 'infinity' AND j.kind = 'notification'
         ORDER BY j.priority, j.run_at, j.id
         LIMIT 50
           FOR UPDATE OF j SKIP LOCKED) h
\gset
WITH c AS (
    SELECT id, notification_jti FROM siwa.jobs WHERE id = ANY(:ids::bigint[])
), b AS (
    SELECT n.jti, n.client_id, n.sub, n.event_type, n.event_time, n.email, n.is_private_email, c.id AS job_id
      FROM c JOIN siwa.notifications n ON n.jti = c.notification_jti
), acc AS (
    SELECT a.client_id, a.sub, a.app_user_id, a.status, a.last_email_event_at
      FROM siwa.accounts a
     WHERE (a.client_id, a.sub) IN (SELECT b.client_id, b.sub FROM b)
     ORDER BY 1, 2
       FOR UPDATE
), e AS (
    SELECT b.*, acc.app_user_id, acc.status,
           (acc.last_email_event_at IS NULL OR b.event_time > acc.last_email_event_at) AS applied
      FROM b JOIN acc ON acc.client_id = b.client_id AND acc.sub = b.sub
), n AS (
    UPDATE siwa.notifications n
       SET processed_at = now(), outcome = CASE WHEN e.applied THEN 'applied' ELSE 'stale' END
      FROM e
     WHERE n.jti = e.jti
), newest AS (
    SELECT DISTINCT ON (e.client_id, e.sub) e.* FROM e WHERE e.applied ORDER BY e.client_id, e.sub, e.event_time DESC
), a AS (
    UPDATE siwa.accounts a
       SET email_forwarding = CASE newest.event_type WHEN 'email-enabled' THEN 'enabled' ELSE 'disabled' END,
           email = coalesce(newest.email, a.email), is_private_email = coalesce(newest.is_private_email, a.is_private_email),
           last_email_event_at = newest.event_time, updated_at = now()
      FROM newest
     WHERE a.client_id = newest.client_id AND a.sub = newest.sub
), ch AS (
    INSERT INTO siwa.account_changes (client_id, sub, app_user_id, change, status, notification_jti, job_id)
    SELECT e.client_id, e.sub, e.app_user_id, replace(e.event_type, '-', '_'), e.status, e.jti, e.job_id
      FROM e WHERE e.applied
     ORDER BY e.event_time
    RETURNING id, client_id, sub, change, status
), told AS (
    SELECT count(pg_notify('siwa_account_changes', json_build_object(
               'id', id, 'client_id', client_id, 'sub', sub, 'change', change, 'status', status)::text)) AS sent
      FROM ch
)
UPDATE siwa.jobs j
   SET state = 'completed', attempt = j.attempt + 1,
       outcome = CASE WHEN e.applied THEN 'applied' ELSE 'stale' END, finalized_at = now(), run_at = least(j.run_at, now())
  FROM e
 WHERE j.id = e.job_id AND (SELECT sent FROM told) >= 0;
COMMIT;
