-- Raw peer of mixes (a) and (b) (deploy/bench/worker.sh): the writes the worker makes for 50
-- notification jobs, set-based: read 50 held jobs
-- with what verifying them needs (FOR UPDATE SKIP LOCKED), then in one statement, mark the
-- notifications processed (erasing a deleted account's), upsert the 50 account rows, queue a
-- revoke job for each token an ending event (consent-revoked, account-deleted) discards, as the
-- worker does (siwa.revoke_tokens_later: mix (b)'s accounts hold one each; (a)'s hold none), append
-- 50 change rows with one pg_notify each, complete the jobs. Every sub appears once in these mixes,
-- so each event is applied (the worker decides that with the ordering rules; this peer knows it).
-- Until 6 December 2026 this peer did not queue the revokes, so on (b) it did less than the worker.
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
), n AS (
    UPDATE siwa.notifications n
       SET processed_at = now(), outcome = 'applied',
           email = CASE WHEN n.event_type = 'account-deleted' THEN NULL ELSE n.email END,
           jws = CASE WHEN n.event_type = 'account-deleted' THEN NULL ELSE n.jws END,
           claims = CASE WHEN n.event_type = 'account-deleted' THEN n.claims - 'events' ELSE n.claims END
      FROM c
     WHERE n.jti = c.notification_jti
    RETURNING n.jti, n.client_id, n.sub, n.event_type, n.event_time, n.email, n.is_private_email, c.id AS job_id
), revoked AS (
    -- The tokens as they were before this statement (every part of it reads the same snapshot),
    -- one job each, in batch order and each account's tokens in turn, one INSERT for the batch.
    INSERT INTO siwa.jobs (kind, priority, client_id, sub, max_attempts, args)
    SELECT 'revoke', 1, n.client_id, n.sub, 2147483647,
           jsonb_build_object('late_token', true, 'token_enc', encode(k.tok, 'base64'), 'reason', 'grant_ended')
      FROM n JOIN siwa.accounts b ON b.client_id = n.client_id AND b.sub = n.sub,
           unnest(array_prepend(b.refresh_token_enc, b.retired_tokens_enc)) WITH ORDINALITY AS k(tok, i)
     WHERE n.event_type IN ('consent-revoked', 'account-deleted') AND k.tok IS NOT NULL
     ORDER BY n.job_id, k.i
), a AS (
    INSERT INTO siwa.accounts AS a (client_id, sub, status, email, is_private_email, email_forwarding,
                                    sessions_revoked_at, last_email_event_at, updated_at)
    SELECT n.client_id, n.sub,
           CASE n.event_type WHEN 'consent-revoked' THEN 'consent_revoked'
                             WHEN 'account-deleted' THEN 'apple_account_deleted' ELSE 'active' END,
           CASE WHEN n.event_type IN ('email-enabled', 'email-disabled') THEN n.email END,
           CASE WHEN n.event_type IN ('email-enabled', 'email-disabled') THEN n.is_private_email END,
           CASE n.event_type WHEN 'email-enabled' THEN 'enabled' WHEN 'email-disabled' THEN 'disabled' END,
           CASE WHEN n.event_type IN ('consent-revoked', 'account-deleted') THEN now() END,
           CASE WHEN n.event_type IN ('email-enabled', 'email-disabled') THEN n.event_time END,
           now()
      FROM n
     ORDER BY 1, 2
    ON CONFLICT (client_id, sub) DO UPDATE
       SET status = CASE WHEN excluded.status = 'active' THEN a.status ELSE excluded.status END,
           refresh_token_enc = CASE WHEN excluded.sessions_revoked_at IS NULL THEN a.refresh_token_enc END,
           retired_tokens_enc = CASE WHEN excluded.sessions_revoked_at IS NULL THEN a.retired_tokens_enc ELSE '{}' END,
           sessions_revoked_at = coalesce(excluded.sessions_revoked_at, a.sessions_revoked_at),
           email_forwarding = coalesce(excluded.email_forwarding, a.email_forwarding),
           email = CASE WHEN excluded.status = 'apple_account_deleted' THEN NULL
                        ELSE coalesce(excluded.email, a.email) END,
           is_private_email = CASE WHEN excluded.status = 'apple_account_deleted' THEN NULL
                                   ELSE coalesce(excluded.is_private_email, a.is_private_email) END,
           last_email_event_at = coalesce(excluded.last_email_event_at, a.last_email_event_at),
           updated_at = now()
    RETURNING a.client_id, a.sub, a.app_user_id, a.status
), ch AS (
    INSERT INTO siwa.account_changes (client_id, sub, app_user_id, change, status, notification_jti, job_id)
    SELECT n.client_id, n.sub, a.app_user_id,
           CASE n.event_type WHEN 'consent-revoked' THEN 'consent_revoked' WHEN 'account-deleted' THEN 'apple_account_deleted'
                             WHEN 'email-enabled' THEN 'email_enabled' ELSE 'email_disabled' END,
           a.status, n.jti, n.job_id
      FROM n JOIN a ON a.client_id = n.client_id AND a.sub = n.sub
     ORDER BY n.job_id
    RETURNING id, client_id, sub, change, status
), told AS (
    SELECT count(pg_notify('siwa_account_changes', json_build_object(
               'id', id, 'client_id', client_id, 'sub', sub, 'change', change, 'status', status)::text)) AS sent
      FROM ch
)
UPDATE siwa.jobs j
   SET state = 'completed', attempt = j.attempt + 1, outcome = 'applied', finalized_at = now(), run_at = least(j.run_at, now())
  FROM c
 WHERE j.id = c.id AND (SELECT sent FROM told) >= 0;
COMMIT;
