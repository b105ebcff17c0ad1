-- 006: the receiver, the only process on the internet, can add notifications and nothing else.
--
-- Before: siwa_receiver could INSERT any row into siwa.jobs (a forged revoke or an effect for any
-- account) and any column of siwa.notifications (a row already marked processed). Now:
--   * siwa.notifications: INSERT on the columns the receiver stores, no more; processed_at and
--     outcome are the worker's. SELECT (jti) stays (ON CONFLICT (jti) needs it).
--   * siwa.jobs: no privilege at all. A notification's job is written by the trigger function
--     siwa.queue_notification_jobs, which runs as its owner (SECURITY DEFINER, fixed search_path:
--     sql/functions/queue.sql), in the same statement as the notification.
-- Roles are cluster-wide and created by 003 only when the migrating user may; like 003, this grants
-- and revokes only for the roles that exist, and is harmless when run again. A DBA who re-runs the
-- grants of 003_roles.sql re-runs this file after it.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_receiver') THEN
        EXECUTE 'REVOKE INSERT ON siwa.jobs FROM siwa_receiver';
        EXECUTE 'REVOKE INSERT ON siwa.notifications FROM siwa_receiver';
        EXECUTE 'GRANT INSERT (jti, client_id, sub, event_type, event_time, email, is_private_email, claims, jws)
                 ON siwa.notifications TO siwa_receiver';
    END IF;
END
$$;
