-- siwa.claim_transfer binds an imported transfer line to whatever `sub` its caller names. Only a
-- caller that has verified Apple's identity token (the worker's app API sign-in) may name one:
-- an app session could otherwise hand any user's line, and so their app_user_id, to an account
-- of its choosing. Earlier releases granted it to siwa_app; sql/functions/transfer.sql no longer
-- does, and this takes the grant back on databases that have it (privileges survive CREATE OR
-- REPLACE). Apps sign users in through POST /v1/sign-in, which claims the line itself.
DO $$
BEGIN
    IF pg_catalog.to_regprocedure('siwa.claim_transfer(text, text, text, text, boolean)') IS NOT NULL
       AND EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_app') THEN
        REVOKE EXECUTE ON FUNCTION siwa.claim_transfer(text, text, text, text, boolean) FROM siwa_app;
    END IF;
END
$$;
