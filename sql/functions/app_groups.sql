-- siwa.app_groups: SIWA_APP_GROUPS, client IDs that share users (a notification for any member
-- applies to the accounts of every member; read by notifications.sql and accounts.sql). Written by
-- every worker at start (WorkerCore's AppGroups); the groups of the last worker started win.
-- Applied after the numbered migrations whenever this file changes (see sql/README.md); the table
-- is in 005_lifecycle.sql.

-- Replaces the table's content with the pairs (p_client_ids[i], p_group_ids[i]). Rows that do not
-- change are not written, so a restart of a worker with the same setting writes nothing. The
-- advisory lock serializes two workers starting at once (each one's whole replacement wins or waits).
CREATE OR REPLACE FUNCTION siwa.store_app_groups(p_client_ids text[], p_group_ids text[]) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(1360658448);  -- 0x511A0010, the app groups' key
    DELETE FROM siwa.app_groups WHERE NOT (client_id = ANY (p_client_ids));
    INSERT INTO siwa.app_groups (client_id, group_id)
    SELECT * FROM unnest(p_client_ids, p_group_ids)
    ON CONFLICT (client_id) DO UPDATE SET group_id = EXCLUDED.group_id
     WHERE app_groups.group_id <> EXCLUDED.group_id;
END
$$;

-- Privileges: the worker; PUBLIC nothing (see jobs.sql).
REVOKE EXECUTE ON FUNCTION siwa.store_app_groups(text[], text[]) FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_worker') THEN
        GRANT EXECUTE ON FUNCTION siwa.store_app_groups(text[], text[]) TO siwa_worker;
    END IF;
END
$$;
