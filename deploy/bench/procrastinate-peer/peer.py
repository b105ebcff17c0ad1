"""The procrastinate peer of deploy/bench/worker.sh: one procrastinate job per notification, doing
the writes the worker makes for it (raw-peer/notifications.sql for one jti): mark the notification
processed, upsert its account, append the change row with its pg_notify. procrastinate claims and
completes its own job rows, as siwa-worker claims and completes siwa.jobs.

    PYTHONPATH=. PEER_DATABASE_URL=... python -c 'import peer; peer.defer(N)'   # N jobs, jti p1..pN
    PYTHONPATH=. PEER_DATABASE_URL=... procrastinate --app peer.app worker --concurrency C
"""
import os

from procrastinate import App, PsycopgConnector

app = App(connector=PsycopgConnector(conninfo=os.environ["PEER_DATABASE_URL"]))

EFFECT = """
WITH n AS (
    UPDATE siwa.notifications n
       SET processed_at = now(), outcome = 'applied',
           email = CASE WHEN n.event_type = 'account-deleted' THEN NULL ELSE n.email END,
           jws = CASE WHEN n.event_type = 'account-deleted' THEN NULL ELSE n.jws END,
           claims = CASE WHEN n.event_type = 'account-deleted' THEN n.claims - 'events' ELSE n.claims END
     WHERE n.jti = %(jti)s AND n.processed_at IS NULL
    RETURNING n.jti, n.client_id, n.sub, n.event_type, n.event_time, n.email, n.is_private_email
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
    ON CONFLICT (client_id, sub) DO UPDATE
       SET status = CASE WHEN excluded.status = 'active' THEN a.status ELSE excluded.status END,
           refresh_token_enc = CASE WHEN excluded.sessions_revoked_at IS NULL THEN a.refresh_token_enc END,
           sessions_revoked_at = coalesce(excluded.sessions_revoked_at, a.sessions_revoked_at),
           email_forwarding = coalesce(excluded.email_forwarding, a.email_forwarding),
           email = CASE WHEN excluded.status = 'apple_account_deleted' THEN NULL
                        ELSE coalesce(excluded.email, a.email) END,
           last_email_event_at = coalesce(excluded.last_email_event_at, a.last_email_event_at),
           updated_at = now()
    RETURNING a.client_id, a.sub, a.app_user_id, a.status
), ch AS (
    INSERT INTO siwa.account_changes (client_id, sub, app_user_id, change, status, notification_jti)
    SELECT n.client_id, n.sub, a.app_user_id,
           CASE n.event_type WHEN 'consent-revoked' THEN 'consent_revoked' WHEN 'account-deleted' THEN 'apple_account_deleted'
                             WHEN 'email-enabled' THEN 'email_enabled' ELSE 'email_disabled' END,
           a.status, n.jti
      FROM n JOIN a ON a.client_id = n.client_id AND a.sub = n.sub
    RETURNING id, client_id, sub, change, status
)
SELECT count(pg_notify('siwa_account_changes', json_build_object(
           'id', id, 'client_id', client_id, 'sub', sub, 'change', change, 'status', status)::text))
  FROM ch
"""


@app.task(name="apply", pass_context=True)
async def apply(context, jti: str) -> None:
    await context.app.connector.execute_query_async(EFFECT, jti=jti)


def defer(count: int) -> None:
    with app.open():
        for start in range(1, count + 1, 5000):
            apply.batch_defer(*({"jti": f"p{i}"} for i in range(start, min(start + 5000, count + 1))))
