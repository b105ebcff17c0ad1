-- The app API (siwa-worker on SIWA_APP_API_LISTEN): single-use sign-in nonces.
--
-- Only the SHA-256 of a nonce is stored. That is the value the identity token's `nonce` claim
-- carries (as hex), so a sign-in finds its row by it, and a copy of this table gives nobody a
-- nonce they could spend. A nonce is consumed by one DELETE ... RETURNING (siwa.consume_nonce), so
-- of any number of concurrent sign-ins with it exactly one wins; expired rows are pruned.
CREATE TABLE siwa.sign_in_nonces (
    nonce_hash bytea       PRIMARY KEY CHECK (length(nonce_hash) = 32),
    expires_at timestamptz NOT NULL
);
CREATE INDEX sign_in_nonces_expiry ON siwa.sign_in_nonces (expires_at);

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_worker') THEN
        EXECUTE 'GRANT SELECT, INSERT, DELETE ON siwa.sign_in_nonces TO siwa_worker';
    END IF;
END
$$;
