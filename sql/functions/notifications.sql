-- What Apple's notifications do to accounts: the four effects, order-aware and idempotent.
-- Applied after the numbered migrations whenever this file changes (see sql/README.md).

-- What each event does to an account is siwa.account_effect's (accounts.sql); this file adds
-- the order of events and the data they carry.

-- The order-aware rules of the four effects, in one place: the outcome of an event against the
-- account state it finds, given what the event does to the account's status (p_effect, from
-- siwa.account_effect(p_status, event type)). Inlined by the planner into the statements of
-- siwa.apply_notifications. The one kind of siwa function without a pinned search_path, on
-- purpose: a SET clause would stop the inlining, and the body names no relation or function, only
-- built-in operators on built-in types, which resolve in pg_catalog first.
-- The order: an unknown type, and any event for a deleted account, are ignored whatever their
-- time; then an event older than the account's link is `stale`; then what the event does to the
-- status decides (p_effect's outcome); last, an email event older than the last email event
-- applied is `stale`, and one that repeats it (same time, same forwarding) is `no_change`.
DROP FUNCTION IF EXISTS siwa.notification_outcome(text, timestamptz, text, timestamptz, timestamptz, text);
CREATE OR REPLACE FUNCTION siwa.notification_outcome(
    p_effect siwa.account_effect, p_status text, p_event_time timestamptz, p_linked_at timestamptz,
    p_last_email_event_at timestamptz, p_email_forwarding text
) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN (p_effect).outcome = 'ignored_unknown_type' OR p_status = 'deleted' THEN (p_effect).outcome
        WHEN p_linked_at IS NOT NULL AND p_event_time < p_linked_at THEN 'stale'
        WHEN (p_effect).outcome <> 'applied' THEN (p_effect).outcome
        WHEN (p_effect).email_forwarding IS NOT NULL AND p_last_email_event_at IS NOT NULL
         AND p_event_time < p_last_email_event_at THEN 'stale'
        WHEN (p_effect).email_forwarding IS NOT NULL AND p_last_email_event_at = p_event_time
         AND p_email_forwarding = (p_effect).email_forwarding THEN 'no_change'
        ELSE 'applied'
    END
$$;

-- Applies a batch of stored notifications to their accounts and records each outcome on its
-- notification (siwa.notifications.outcome; a jti with no row is `missing` to the caller).
-- Idempotent (a processed notification is left as it is) and order-aware: the events of one
-- account are applied in event_time order (then batch order), each against the state the
-- previous one left, with the rules of siwa.account_effect and siwa.notification_outcome. Set-based: a few statements
-- per batch, one more per extra event of the busiest account.
--
-- Locks: the accounts the batch may touch are inserted (if missing) or locked in key order by one
-- statement, so two batches with overlapping accounts cannot deadlock on each other. An account
-- another transaction holds right now (its row exists but cannot be locked at once: SKIP LOCKED)
-- is not waited for: every event of its user is left unprocessed, for the caller to leave queued
-- (siwa.run_notification_batch reports those jobs `deferred`), so concurrent batches on shared
-- accounts do not queue up behind each other's locks. Every
-- notification row is written once (outcome and, when its account is deleted, the erasure);
-- every account row once per applied event (a new account with one event here: once, by the
-- statement that creates it); account_changes gets one row and one
-- NOTIFY siwa_account_changes per applied effect, with the account's state after it.
CREATE OR REPLACE FUNCTION siwa.apply_notifications(p_jtis text[], p_job_ids bigint[]) RETURNS void
LANGUAGE plpgsql
-- Every statement here is driven by the batch's keys: nested loops over primary-key and account
-- index lookups, whatever stale statistics (a table analyzed empty, then filled) would suggest.
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    ev_jtis text[];
    ev_jobs bigint[];
    ev_ranks bigint[];
    ev_targets text[];
    ev_subs text[];
    ev_primary boolean[];
    ev_fresh boolean[];
    grouped boolean;
    rounds bigint;
    round_clients text[];
    round_subs text[];
    erase_clients text[] := '{}';
    erase_subs text[] := '{}';
    round_email_clients text[];
    round_email_subs text[];
    email_clients text[] := '{}';
    email_subs text[] := '{}';
BEGIN
    -- The unprocessed notifications, each ranked among its user's known-type events (the user: the
    -- sub within the client ID's app group, SIWA_APP_GROUPS, or within the client ID alone); an
    -- unknown type changes no account (rank 1, never applied). Each event targets every account of
    -- its user: in a group, the members' accounts with that sub (a web sign-in linked under a
    -- Services ID gets the App ID's notification); with none, or outside a group, the account of
    -- the notification's own client ID. The targeted accounts are created ('active': Apple only
    -- notifies about users who signed in, so an unknown sub is a link we never saw) or locked
    -- (DO UPDATE ... WHERE false locks without writing). One target per event is its primary: the
    -- notification records that account's outcome.
    grouped := EXISTS (SELECT 1 FROM siwa.app_groups);
    WITH b AS (
        SELECT n.jti, u.job_id, u.ord, n.client_id, n.sub, n.event_type, n.event_time, n.email, n.is_private_email,
               g.group_id, siwa.apple_event_known(n.event_type) AS known,
               CASE WHEN siwa.apple_event_known(n.event_type)
                    THEN row_number() OVER (
                        PARTITION BY coalesce(g.group_id, n.client_id), n.sub,
                                     siwa.apple_event_known(n.event_type)
                        ORDER BY n.event_time, u.ord)
                    ELSE 1 END AS rank
          FROM unnest(p_jtis, p_job_ids) WITH ORDINALITY AS u(jti, job_id, ord)
          JOIN siwa.notifications n ON n.jti = u.jti
          LEFT JOIN siwa.app_groups g ON g.client_id = n.client_id
         WHERE n.processed_at IS NULL
    ), t AS (
        -- Without SIWA_APP_GROUPS (the usual case) each event targets its own account only.
        SELECT b.*, b.client_id AS target, true AS is_primary FROM b WHERE NOT grouped
        UNION ALL
        SELECT b.*, x.target, x.is_primary
          FROM b CROSS JOIN LATERAL (
              -- Key lookups only: the group's members, then each (member, sub) by primary key.
              SELECT mem.client_id AS target,
                     row_number() OVER (ORDER BY mem.client_id <> b.client_id, mem.client_id) = 1 AS is_primary
                FROM unnest(ARRAY(SELECT m.client_id FROM siwa.app_groups m WHERE m.group_id = b.group_id)) AS mem(client_id)
               WHERE b.group_id IS NOT NULL AND b.known
                 AND EXISTS (SELECT 1 FROM siwa.accounts a WHERE a.client_id = mem.client_id AND a.sub = b.sub)
              UNION ALL
              SELECT b.client_id, true
               WHERE b.group_id IS NULL OR NOT b.known OR NOT EXISTS (
                     SELECT 1 FROM unnest(ARRAY(SELECT m.client_id FROM siwa.app_groups m WHERE m.group_id = b.group_id)) AS mem(client_id)
                      WHERE EXISTS (SELECT 1 FROM siwa.accounts a WHERE a.client_id = mem.client_id AND a.sub = b.sub))
          ) x
         WHERE grouped
    ), busy AS (
        -- Users with a targeted account another transaction holds (the row is there, the lock is not
        -- to be had now). The lock taken here on the others is the one `locked` takes anyway.
        -- Scalar subqueries, not EXISTS: two primary-key probes per event, never a join the planner
        -- could turn into a scan of every account (a generic plan from an empty table's statistics).
        SELECT DISTINCT coalesce(t.group_id, t.client_id) AS user_key, t.sub
          FROM t
         WHERE t.known
           AND (SELECT true FROM siwa.accounts a WHERE a.client_id = t.target AND a.sub = t.sub)
           AND (SELECT true FROM siwa.accounts a WHERE a.client_id = t.target AND a.sub = t.sub
                   FOR UPDATE SKIP LOCKED) IS NULL
    ), kept AS (
        -- Whole users only: ranks stay gapless, and a user's events are applied together or not at all.
        -- single: the account's only event here, outside a group (a new account gets it written at once).
        SELECT t.*, NOT grouped AND count(*) OVER (PARTITION BY t.target, t.sub) = 1 AS single FROM t
         WHERE NOT EXISTS (SELECT 1 FROM busy
                            WHERE busy.user_key = coalesce(t.group_id, t.client_id) AND busy.sub = t.sub)
    ), locked AS (
        -- A single event's new account gets what round 1 would write on an account created
        -- 'active' for it, from the INSERT itself: one heap tuple and one index entry, not an insert
        -- then an update (the round judges such an event against that 'active' account, and skips
        -- the write). No join of CTEs: with hash and merge joins off it is a nested loop, one CTE
        -- read once per row of the other.
        INSERT INTO siwa.accounts AS a (client_id, sub, status, sessions_revoked_at, email_forwarding, email,
                                        is_private_email, last_email_event_at)
        SELECT DISTINCT ON (f.target, f.sub) f.target, f.sub,
               CASE WHEN f.applies THEN (f.effect).next_status ELSE 'active' END,
               CASE WHEN f.applies AND (f.effect).ends_sessions THEN now() END,
               CASE WHEN f.applies THEN (f.effect).email_forwarding END,
               CASE WHEN f.applies AND NOT (f.effect).erases_personal_data AND siwa.email_event(f.event_type) THEN f.email END,
               CASE WHEN f.applies AND NOT (f.effect).erases_personal_data AND siwa.email_event(f.event_type)
                    THEN f.is_private_email END,
               CASE WHEN f.applies AND siwa.email_event(f.event_type) THEN f.event_time END
          FROM (SELECT e.*, e.single AND siwa.notification_outcome(e.effect, 'active', e.event_time, NULL, NULL, NULL)
                                         = 'applied' AS applies
                  -- OFFSET 0: the effect made once a row (flattened, each use of a field evaluates the call).
                  FROM (SELECT t.*, siwa.account_effect('active', t.event_type) AS effect FROM kept t WHERE t.known
                        OFFSET 0) e) f
         ORDER BY f.target, f.sub
        ON CONFLICT (client_id, sub) DO UPDATE SET status = a.status WHERE false
        RETURNING a.client_id, a.sub  -- the rows inserted (a conflict's DO UPDATE ... WHERE false returns none)
    )
    -- fresh: a single event whose account this statement inserted, looked up in one jsonb object of
    -- the inserted keys (an uncorrelated subquery: made once; a binary search a row, not a scan of
    -- `locked`).
    SELECT array_agg(t.jti ORDER BY t.ord, t.target), array_agg(t.job_id ORDER BY t.ord, t.target),
           array_agg(t.rank ORDER BY t.ord, t.target), array_agg(t.target ORDER BY t.ord, t.target),
           array_agg(t.is_primary ORDER BY t.ord, t.target), array_agg(t.sub ORDER BY t.ord, t.target), max(t.rank),
           array_agg(t.single AND (SELECT coalesce(jsonb_object_agg(length(l.client_id) || ':' || l.client_id || l.sub, true), '{}')
                                     FROM locked l) ? (length(t.target) || ':' || t.target || t.sub)
                     ORDER BY t.ord, t.target)
      INTO ev_jtis, ev_jobs, ev_ranks, ev_targets, ev_primary, ev_subs, rounds, ev_fresh
      FROM kept t;

    -- Several email events of one account in this batch (a hot account) are applied in one
    -- set-based round, not one round each (a round costs as much for one event as for a batch):
    -- where email events cannot change the account's status (every status but deleted,
    -- apple_account_deleted and pending_deletion) and without app groups (one target an event).
    -- siwa.notification_outcome still judges each event, against the state the events before it
    -- (event_time, then batch order) leave, derived instead of applied one by one: an email event
    -- changes only last_email_event_at and email_forwarding (to its own time and type), or nothing
    -- (stale, no_change leave it as it is). So, in that order, the events at or after
    -- greatest(linked_at, last_email_event_at) are the ones not stale, each finds the state its
    -- predecessor left (that one's time and type), and those before find the account as it is.
    -- The account is written once, with its last applied event and the newest email and
    -- is_private_email among the applied ones (what coalesce in turn leaves); every event gets its
    -- outcome, every applied one its change row and NOTIFY, in event order, as the rounds would
    -- (WorkerTests.aHotAccountsEmailEventsInOneRoundEndAsOneByOne compares the two).
    IF NOT grouped AND rounds > 1 THEN
        WITH u AS (
            SELECT u.jti, u.job_id, u.rank, u.ord, u.target, u.sub, n.event_type, n.event_time, n.email, n.is_private_email
              FROM unnest(ev_jtis, ev_jobs, ev_ranks, ev_targets, ev_subs) WITH ORDINALITY AS u(jti, job_id, rank, target, sub, ord)
              LEFT JOIN siwa.notifications n ON n.jti = u.jti
        ), e AS (
            -- hot: the account has several events here, all email events (a window, not a join
            -- with the grouped accounts: with hash joins off that join read every group once per event).
            SELECT u.*, a.status, a.linked_at, a.last_email_event_at, a.email_forwarding, a.app_user_id,
                   siwa.account_effect(a.status, u.event_type) AS effect,
                   coalesce(u.hot AND NOT siwa.ignores_email_events(a.status), false) AS folded,
                   greatest(a.linked_at, a.last_email_event_at) IS NULL
                   OR u.event_time >= greatest(a.linked_at, a.last_email_event_at) AS live
              FROM (SELECT u.*, coalesce(count(*) OVER w > 1 AND bool_and(siwa.email_event(u.event_type)) OVER w, false) AS hot
                      FROM u WINDOW w AS (PARTITION BY u.target, u.sub)) u
              LEFT JOIN siwa.accounts a ON u.hot AND a.client_id = u.target AND a.sub = u.sub
        ), f AS (
            SELECT e.*, siwa.notification_outcome(
                       e.effect, e.status, e.event_time, e.linked_at,
                       CASE WHEN e.previous_live THEN e.previous_time ELSE e.last_email_event_at END,
                       CASE WHEN e.previous_live THEN e.previous_forwarding ELSE e.email_forwarding END) AS outcome
              FROM (SELECT e.*, coalesce(lag(e.live) OVER w, false) AS previous_live,
                           lag(e.event_time) OVER w AS previous_time,
                           lag((e.effect).email_forwarding) OVER w AS previous_forwarding
                      FROM e WHERE e.folded
                    WINDOW w AS (PARTITION BY e.target, e.sub ORDER BY e.event_time, e.ord)) e
        ), n AS (
            UPDATE siwa.notifications n SET processed_at = now(), outcome = f.outcome
              FROM f
             WHERE n.jti = f.jti AND n.processed_at IS NULL  -- rechecked under the row lock
            RETURNING f.*
        ), last AS (
            SELECT n.target, n.sub, max(n.event_time) AS event_time,
                   (array_agg(n.effect ORDER BY n.event_time DESC, n.ord DESC))[1] AS effect,
                   (array_agg(n.email ORDER BY n.event_time DESC, n.ord DESC) FILTER (WHERE n.email IS NOT NULL))[1] AS email,
                   (array_agg(n.is_private_email ORDER BY n.event_time DESC, n.ord DESC)
                        FILTER (WHERE n.is_private_email IS NOT NULL))[1] AS is_private_email
              FROM n WHERE n.outcome = 'applied' GROUP BY n.target, n.sub
        ), a AS (
            UPDATE siwa.accounts a
               SET status = (last.effect).next_status,
                   email_forwarding = (last.effect).email_forwarding,
                   email = coalesce(last.email, a.email),
                   is_private_email = coalesce(last.is_private_email, a.is_private_email),
                   last_email_event_at = last.event_time, updated_at = now()
              FROM last
             WHERE a.client_id = last.target AND a.sub = last.sub
        ), told AS (
            -- The change rows and their NOTIFYs in event order, the whole batch in one call.
            SELECT count(*) AS sent
              FROM (SELECT array_agg(n.target ORDER BY n.target, n.sub, n.event_time, n.ord) AS client_ids,
                           array_agg(n.sub ORDER BY n.target, n.sub, n.event_time, n.ord) AS subs,
                           array_agg(n.app_user_id ORDER BY n.target, n.sub, n.event_time, n.ord) AS app_user_ids,
                           array_agg((n.effect).change ORDER BY n.target, n.sub, n.event_time, n.ord) AS changes,
                           array_agg((n.effect).next_status ORDER BY n.target, n.sub, n.event_time, n.ord) AS statuses,
                           array_agg(n.jti ORDER BY n.target, n.sub, n.event_time, n.ord) AS jtis,
                           array_agg(n.job_id ORDER BY n.target, n.sub, n.event_time, n.ord) AS job_ids
                      FROM n WHERE n.outcome = 'applied') x,
                   siwa.record_changes(x.client_ids, x.subs, x.app_user_ids, x.changes, x.statuses, NULL,
                                       x.jtis, x.job_ids)
        )
        -- The rounds skip what was applied here (rank 0).
        SELECT array_agg(CASE WHEN e.folded THEN 0 ELSE e.rank END ORDER BY e.ord),
               max(e.rank) FILTER (WHERE NOT e.folded)
          INTO ev_ranks, rounds
          FROM e, told;
    END IF;

    -- Round r applies the r-th event of every account at once (almost always one round).
    FOR r IN 1 .. coalesce(rounds, 0) LOOP
        -- The event's effect once per event (MATERIALIZED: inlined, every column read below would
        -- evaluate siwa.account_effect again).
        WITH x AS MATERIALIZED (
            SELECT n.jti, u.job_id, u.ord, n.client_id, u.target, u.is_primary, u.fresh, n.sub, n.event_type, n.event_time,
                   n.email, n.is_private_email, CASE WHEN u.fresh THEN 'active' ELSE a.status END AS status,
                   a.email IS NOT NULL AS account_has_email,
                   a.app_user_id AS app_user_id_before, a.refresh_token_enc AS token_before,
                   a.retired_tokens_enc AS retired_before,
                   a.linked_at, a.last_email_event_at, a.email_forwarding,
                   siwa.account_effect(CASE WHEN u.fresh THEN 'active' ELSE a.status END, n.event_type) AS effect
              FROM unnest(ev_jtis, ev_jobs, ev_ranks, ev_targets, ev_primary, ev_subs, ev_fresh)
                   WITH ORDINALITY AS u(jti, job_id, rank, target, is_primary, sub, fresh, ord)
              JOIN siwa.notifications n ON n.jti = u.jti
              -- Both key columns from u: one primary-key probe per event, never a scan by sub alone.
              -- A fresh account (written whole by the INSERT above) is judged as it was created:
              -- 'active', nothing else set (no row joined).
              LEFT JOIN siwa.accounts a ON NOT u.fresh AND a.client_id = u.target AND a.sub = u.sub
             WHERE u.rank = r
        ), e AS (
            SELECT x.*, siwa.notification_outcome(x.effect, x.status, x.event_time, x.linked_at,
                                                  x.last_email_event_at, x.email_forwarding) AS outcome
              FROM x
        ), d AS (
            -- erase: the account is deleted or deleted at Apple once this event is applied.
            SELECT e.*, coalesce(e.status IN ('deleted', 'apple_account_deleted'), false)
                        OR (e.outcome = 'applied' AND (e.effect).erases_personal_data) AS erase
              FROM e
        ), n AS (
            UPDATE siwa.notifications n
               SET processed_at = now(), outcome = d.outcome,
                   email = CASE WHEN d.erase THEN NULL ELSE n.email END,
                   jws = CASE WHEN d.erase THEN NULL ELSE n.jws END,
                   claims = CASE WHEN d.erase THEN n.claims - 'events' ELSE n.claims END
              FROM d
             WHERE n.jti = d.jti AND d.is_primary AND n.processed_at IS NULL  -- rechecked under the row lock
            RETURNING d.*
        ), t AS (
            -- Every targeted account: the primaries the notification update kept, and the rest of
            -- their groups (read unprocessed after the accounts were locked).
            SELECT * FROM n
            UNION ALL
            SELECT * FROM d WHERE NOT d.is_primary
        ), revoked AS (
            -- The tokens an ending event discards are revoked by jobs of their own, never dropped:
            -- one issued after the event (a late exchange, an import) may still be live at Apple.
            -- All of the round's in one INSERT (siwa.revoke_tokens_later), in the order a call per
            -- token queued them: the targeted accounts as `t` yields them, each one's tokens in turn.
            SELECT siwa.revoke_tokens_later(array_agg(n.target ORDER BY n.pos, k.i), array_agg(n.sub ORDER BY n.pos, k.i),
                                            array_agg(k.tok ORDER BY n.pos, k.i), 'grant_ended') AS queued
              FROM (SELECT t.*, row_number() OVER () AS pos FROM t) n,
                   unnest(array_prepend(n.token_before, n.retired_before)) WITH ORDINALITY AS k(tok, i)
             WHERE n.outcome = 'applied' AND (n.effect).ends_grant AND k.tok IS NOT NULL
        ), a AS (
            UPDATE siwa.accounts a
               SET status = (n.effect).next_status,
                   refresh_token_enc = CASE WHEN (n.effect).ends_grant THEN NULL ELSE a.refresh_token_enc END,
                   retired_tokens_enc = CASE WHEN (n.effect).ends_grant THEN '{}' ELSE a.retired_tokens_enc END,
                   sessions_revoked_at = CASE WHEN (n.effect).ends_sessions THEN now() ELSE a.sessions_revoked_at END,
                   email_forwarding = coalesce((n.effect).email_forwarding, a.email_forwarding),
                   email = CASE WHEN n.erase THEN NULL
                                WHEN siwa.email_event(n.event_type) THEN coalesce(n.email, a.email)
                                ELSE a.email END,
                   is_private_email = CASE WHEN n.erase AND a.email IS NOT NULL THEN NULL
                                           WHEN siwa.email_event(n.event_type)
                                           THEN coalesce(n.is_private_email, a.is_private_email)
                                           ELSE a.is_private_email END,
                   full_name = CASE WHEN n.erase THEN NULL ELSE a.full_name END,
                   real_user_status = CASE WHEN n.erase THEN NULL ELSE a.real_user_status END,
                   app_user_id = CASE WHEN n.erase THEN NULL ELSE a.app_user_id END,
                   last_email_event_at = CASE WHEN siwa.email_event(n.event_type)
                                              THEN n.event_time ELSE a.last_email_event_at END,
                   updated_at = now()
              FROM t n
             WHERE n.outcome = 'applied' AND NOT n.fresh AND a.client_id = n.target AND a.sub = n.sub
            RETURNING a.client_id, a.sub, n.app_user_id_before AS app_user_id, a.status, n.jti, n.job_id, n.ord,
                      (n.effect).change AS change
        ), written AS (
            SELECT * FROM a
            UNION ALL
            SELECT n.target, n.sub, n.app_user_id_before, (n.effect).next_status, n.jti, n.job_id, n.ord, (n.effect).change
              FROM t n WHERE n.outcome = 'applied' AND n.fresh
        ), told AS (
            -- The change rows and their NOTIFYs in batch order, the whole round in one call.
            SELECT count(*) AS sent
              FROM (SELECT array_agg(a.client_id ORDER BY a.ord) AS client_ids, array_agg(a.sub ORDER BY a.ord) AS subs,
                           array_agg(a.app_user_id ORDER BY a.ord) AS app_user_ids,
                           array_agg(a.change ORDER BY a.ord) AS changes, array_agg(a.status ORDER BY a.ord) AS statuses,
                           array_agg(a.jti ORDER BY a.ord) AS jtis, array_agg(a.job_id ORDER BY a.ord) AS job_ids
                      FROM written a) x,
                   siwa.record_changes(x.client_ids, x.subs, x.app_user_ids, x.changes, x.statuses, NULL,
                                       x.jtis, x.job_ids)
        )
        -- Erased: the notifications stored under the notification's client ID and under the
        -- target's (the same outside a group).
        SELECT array_agg(n.client_id) FILTER (WHERE n.erase) || array_agg(n.target) FILTER (WHERE n.erase AND n.target <> n.client_id),
               array_agg(n.sub) FILTER (WHERE n.erase) || array_agg(n.sub) FILTER (WHERE n.erase AND n.target <> n.client_id),
               array_agg(n.target) FILTER (WHERE n.erase AND n.account_has_email AND n.outcome <> 'applied'),
               array_agg(n.sub) FILTER (WHERE n.erase AND n.account_has_email AND n.outcome <> 'applied')
          INTO round_clients, round_subs, round_email_clients, round_email_subs
          FROM t n, told, revoked;
        erase_clients := erase_clients || coalesce(round_clients, '{}');
        erase_subs := erase_subs || coalesce(round_subs, '{}');
        email_clients := email_clients || coalesce(round_email_clients, '{}');
        email_subs := email_subs || coalesce(round_email_subs, '{}');
    END LOOP;

    -- Personal data does not outlive its purpose: the rest of a deleted account's notifications,
    -- and the account's email (what the rounds did not already erase in their own writes).
    IF cardinality(erase_clients) > 0 THEN
        UPDATE siwa.notifications n
           SET email = NULL, jws = NULL, claims = n.claims - 'events'
          FROM (SELECT DISTINCT u.client_id, u.sub FROM unnest(erase_clients, erase_subs) AS u(client_id, sub)) d
         WHERE n.client_id = d.client_id AND n.sub = d.sub
           AND (n.email IS NOT NULL OR n.jws IS NOT NULL OR n.claims ? 'events');
    END IF;
    IF cardinality(email_clients) > 0 THEN
        UPDATE siwa.accounts a SET email = NULL, is_private_email = NULL
          FROM (SELECT DISTINCT u.client_id, u.sub FROM unnest(email_clients, email_subs) AS u(client_id, sub)) d
         WHERE a.client_id = d.client_id AND a.sub = d.sub AND a.email IS NOT NULL;
    END IF;
END
$$;

-- Applies one stored notification (siwa.apply_notifications with a batch of one) and returns the
-- outcome recorded on it: `applied`, `no_change`, `stale`, `ignored_account_deleted`,
-- `ignored_unknown_type`, `missing` (pruned by retention before it ran), or `deferred` (left
-- unprocessed: its account is held by another transaction right now).
CREATE OR REPLACE FUNCTION siwa.apply_notification(p_jti text, p_job_id bigint) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    result text;
BEGIN
    PERFORM siwa.apply_notifications(ARRAY[p_jti], ARRAY[p_job_id]);
    SELECT coalesce(n.outcome, 'deferred') INTO result FROM siwa.notifications n WHERE n.jti = p_jti;
    RETURN coalesce(result, 'missing');
END
$$;

-- The notifications of held jobs the worker's gate refused (siwa.forged_notifications, jobs.sql):
-- recorded `forged`, never applied.
CREATE OR REPLACE FUNCTION siwa.notifications_forged(p_job_ids bigint[]) RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE siwa.notifications n SET processed_at = now(), outcome = 'forged'
      FROM siwa.jobs j
     WHERE j.id = ANY (p_job_ids) AND n.jti = j.notification_jti AND n.processed_at IS NULL;
END
$$;

-- A deleted account's notifications keep only what recognises a redelivery (jti) and what
-- happened (type, time): siwa.erase_personal_data (accounts.sql) calls this.
CREATE OR REPLACE FUNCTION siwa.erase_notifications(p_client_id text, p_sub text) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    UPDATE siwa.notifications
       SET email = NULL, jws = NULL, claims = claims - 'events'
     WHERE client_id = p_client_id AND sub = p_sub
       AND (email IS NOT NULL OR jws IS NOT NULL OR claims ? 'events');
$$;

-- The receiver's one write: a batch of verified notifications in one statement (its group commit:
-- concurrent requests share it), one array per column, bound as text: p_email '' is none,
-- p_is_private_email 't', 'f' or '' (none), p_event_ms milliseconds since the epoch. A jti stored
-- already is left as it was (Apple redelivers). The statement trigger queues their jobs in the same
-- statement (siwa.queue_notification_jobs: held for a siwa_receiver login). Runs as the caller
-- (no SECURITY DEFINER): the receiver's role keeps exactly its column privileges
-- (006_hardening.sql) and gains only EXECUTE on this function. plpgsql, so the INSERT is planned
-- once a session. Returns the jti of each row stored: `SELECT FROM siwa.store_notifications(...)`
-- reports their count as the statement's row count, without sending them.
CREATE OR REPLACE FUNCTION siwa.store_notifications(
    p_jti text[], p_client_id text[], p_sub text[], p_event_type text[], p_event_ms bigint[],
    p_email text[], p_is_private_email text[], p_claims text[], p_jws text[]
) RETURNS TABLE (jti text)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    INSERT INTO siwa.notifications AS n
        (jti, client_id, sub, event_type, event_time, email, is_private_email, claims, jws)
    SELECT t.jti, t.client_id, t.sub, t.event_type, to_timestamp(t.event_ms::float8 / 1000), nullif(t.email, ''),
           nullif(t.private, '')::boolean, t.claims::jsonb, t.jws
      FROM unnest(p_jti, p_client_id, p_sub, p_event_type, p_event_ms, p_email, p_is_private_email, p_claims, p_jws)
        AS t(jti, client_id, sub, event_type, event_ms, email, private, claims, jws)
    ON CONFLICT (jti) DO NOTHING
    RETURNING n.jti;
END
$$;

-- Retention (the worker's pass, SIWA_RETENTION_DAYS), at most p_batch rows a call, each returning
-- how many rows it changed.
-- Notifications processed more than p_age_seconds ago, with their completed or cancelled jobs
-- (siwa.prune_notification_jobs, jobs.sql). Discarded jobs are kept (an operator may still retry
-- them; the effect then reports `missing`).
CREATE OR REPLACE FUNCTION siwa.prune_notifications(p_age_seconds double precision, p_batch integer)
RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    victims text[];
    pruned integer;
BEGIN
    victims := ARRAY(SELECT n.jti FROM siwa.notifications n
                      WHERE n.processed_at < now() - make_interval(secs => p_age_seconds)
                      LIMIT p_batch);
    PERFORM siwa.prune_notification_jobs(victims);
    DELETE FROM siwa.notifications WHERE jti = ANY (victims);
    GET DIAGNOSTICS pruned = ROW_COUNT;
    RETURN pruned;
END
$$;

-- Notifications whose job was discarded more than p_age_seconds ago stay (an operator may still
-- retry them) without their personal data: email, the signed token, the events claim.
CREATE OR REPLACE FUNCTION siwa.scrub_discarded_notifications(p_age_seconds double precision, p_batch integer)
RETURNS integer
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    WITH scrubbed AS (
        UPDATE siwa.notifications n SET email = NULL, jws = NULL, claims = n.claims - 'events'
          FROM (SELECT j.notification_jti FROM siwa.jobs j
                 WHERE j.finalized_at < now() - make_interval(secs => p_age_seconds)
                   AND j.state = 'discarded' AND j.kind = 'notification'
                 LIMIT p_batch) d
         WHERE n.jti = d.notification_jti
           AND (n.email IS NOT NULL OR n.jws IS NOT NULL OR n.claims ? 'events')
        RETURNING 1
    )
    SELECT count(*)::integer FROM scrubbed
$$;

-- The receiver's other write: what it refused since its last flush, p_counts[i] requests for
-- p_reasons[i], added to this minute's counters (siwa.rejections, one row per minute and reason;
-- `siwa status` and the console show the last hour). Runs as the caller, like
-- siwa.store_notifications: the receiver's role keeps exactly its privileges on the table
-- (003_roles.sql) and gains only EXECUTE on this. plpgsql: planned once a session.
CREATE OR REPLACE FUNCTION siwa.count_rejections(p_reasons text[], p_counts bigint[]) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO siwa.rejections AS r (minute, reason, count)
    SELECT date_trunc('minute', now()), t.reason, t.n FROM unnest(p_reasons, p_counts) AS t(reason, n)
    ON CONFLICT (minute, reason) DO UPDATE SET count = r.count + excluded.count;
END
$$;

-- The receiver's per-minute rejection counters older than p_age_seconds (`siwa status` shows the last hour).
CREATE OR REPLACE FUNCTION siwa.prune_rejections(p_age_seconds double precision) RETURNS integer
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    WITH pruned AS (
        DELETE FROM siwa.rejections WHERE minute < now() - make_interval(secs => p_age_seconds) RETURNING 1
    )
    SELECT count(*)::integer FROM pruned
$$;

-- Privileges: the worker applies effects and prunes; the receiver stores (see jobs.sql on PUBLIC).
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA siwa FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_worker') THEN
        GRANT EXECUTE ON FUNCTION
            siwa.notification_outcome(siwa.account_effect, text, timestamptz, timestamptz, timestamptz, text),
            siwa.apply_notifications(text[], bigint[]), siwa.apply_notification(text, bigint),
            siwa.notifications_forged(bigint[]),
            siwa.erase_notifications(text, text),
            siwa.prune_notifications(double precision, integer),
            siwa.scrub_discarded_notifications(double precision, integer), siwa.prune_rejections(double precision)
           TO siwa_worker;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_receiver') THEN
        GRANT EXECUTE ON FUNCTION siwa.store_notifications(text[], text[], text[], text[], bigint[], text[], text[],
                                                           text[], text[]),
                                  siwa.count_rejections(text[], bigint[])
           TO siwa_receiver;
        -- and to the worker, which may write notifications and counters anyway: 003's grant of every
        -- function to it, re-run by a DBA, then changes nothing.
        IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_worker') THEN
            GRANT EXECUTE ON FUNCTION siwa.store_notifications(text[], text[], text[], text[], bigint[], text[], text[],
                                                               text[], text[]),
                                      siwa.count_rejections(text[], bigint[])
               TO siwa_worker;
        END IF;
    END IF;
END
$$;
