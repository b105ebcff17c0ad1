-- Least-privilege group roles. They are NOLOGIN: operators create login users and GRANT one of
-- these to each (e.g. `CREATE ROLE receiver_prod LOGIN PASSWORD '...' IN ROLE siwa_receiver`).
--
--   siwa_receiver  stores verified notifications (the trigger queues their jobs in the same
--                  statement) and counts rejections; reads nothing else.
--   siwa_worker    the queue, the effects, the accounts, retention.
--   siwa_app       the app's side of the contract: siwa.link_account, siwa.request_deletion,
--                  and reading siwa.account_changes. Nothing else.
--
-- Roles are cluster-wide, so this file is written to be harmless when run again, or in a
-- second database of the same cluster: roles are created only when missing, and only when the
-- migrating user may (superuser or CREATEROLE); otherwise it says so (NOTICE) and still grants
-- to the roles that already exist (a DBA may create them beforehand).

-- 1. Roles -----------------------------------------------------------------------------------
DO $$
DECLARE
    can_create boolean;
    role_name  text;
BEGIN
    SELECT rolsuper OR rolcreaterole INTO can_create FROM pg_catalog.pg_roles WHERE rolname = current_user;
    FOREACH role_name IN ARRAY ARRAY['siwa_receiver', 'siwa_worker', 'siwa_app'] LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = role_name);
        IF coalesce(can_create, false) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', role_name);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN  -- another database migrating at once
                NULL;  -- created meanwhile by a migration of another database in this cluster
            END;
        ELSE
            RAISE NOTICE 'siwa: role % does not exist and % may not create roles; skipped (a DBA can run CREATE ROLE % NOLOGIN and re-run the grants of 003_roles.sql)',
                role_name, current_user, role_name;
        END IF;
    END LOOP;
END
$$;

-- 2. App-facing functions run as their owner ----------------------------------------------------
-- They write siwa.accounts, siwa.jobs and siwa.account_changes, which siwa_app cannot touch.
-- A fixed search_path keeps a caller's objects out of them (their bodies qualify every name).
ALTER FUNCTION siwa.link_account(text, text, text, text) SECURITY DEFINER;
ALTER FUNCTION siwa.link_account(text, text, text, text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION siwa.request_deletion(text, text) SECURITY DEFINER;
ALTER FUNCTION siwa.request_deletion(text, text) SET search_path = pg_catalog, pg_temp;

-- 3. Nothing by default ------------------------------------------------------------------------
-- Functions are executable by PUBLIC when created; take that away, here and for functions later
-- migrations create (those must GRANT explicitly). Trigger functions still fire for anyone who
-- may write the table: EXECUTE is not checked when a trigger fires.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA siwa FROM PUBLIC;
ALTER DEFAULT PRIVILEGES IN SCHEMA siwa REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;
REVOKE ALL ON SCHEMA siwa FROM PUBLIC;

-- 4. Grants, to the roles that exist ---------------------------------------------------------------
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_receiver') THEN
        EXECUTE 'GRANT USAGE ON SCHEMA siwa TO siwa_receiver';
        -- INSERT ... ON CONFLICT (jti) DO NOTHING: PostgreSQL checks SELECT on the conflict
        -- target's columns (without it: "permission denied for table notifications"), so the
        -- receiver may read jti and nothing else of a notification.
        EXECUTE 'GRANT INSERT ON siwa.notifications TO siwa_receiver';
        EXECUTE 'GRANT SELECT (jti) ON siwa.notifications TO siwa_receiver';
        -- The AFTER INSERT trigger on notifications queues the job as the inserting user.
        EXECUTE 'GRANT INSERT ON siwa.jobs TO siwa_receiver';
        -- Rejection counters: INSERT ... ON CONFLICT (minute, reason) DO UPDATE SET count =
        -- rejections.count + EXCLUDED.count reads the conflict target and count.
        EXECUTE 'GRANT INSERT, UPDATE ON siwa.rejections TO siwa_receiver';
        EXECUTE 'GRANT SELECT (minute, reason, count) ON siwa.rejections TO siwa_receiver';
    END IF;

    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_worker') THEN
        EXECUTE 'GRANT USAGE ON SCHEMA siwa TO siwa_worker';
        EXECUTE 'GRANT SELECT, INSERT, UPDATE, DELETE ON siwa.jobs, siwa.notifications, siwa.accounts,
                 siwa.account_changes, siwa.paused_clients, siwa.rejections TO siwa_worker';
        EXECUTE 'GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA siwa TO siwa_worker';
        -- So a worker can tell which migrations are applied (the table exists once `siwa migrate`
        -- has run; 003 applied by hand on a bare database has none).
        IF pg_catalog.to_regclass('siwa.schema_migrations') IS NOT NULL THEN
            EXECUTE 'GRANT SELECT ON siwa.schema_migrations TO siwa_worker';
        END IF;
    END IF;

    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_app') THEN
        EXECUTE 'GRANT USAGE ON SCHEMA siwa TO siwa_app';
        EXECUTE 'GRANT EXECUTE ON FUNCTION siwa.link_account(text, text, text, text) TO siwa_app';
        EXECUTE 'GRANT EXECUTE ON FUNCTION siwa.request_deletion(text, text) TO siwa_app';
        EXECUTE 'GRANT SELECT ON siwa.account_changes TO siwa_app';
    END IF;
END
$$;
