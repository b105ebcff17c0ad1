-- Web and Android sign-in, served (CONTRACT.md): the receiver's GET /apple/sign-in keeps a state
-- here instead of in a cookie (Apple's cross-site form_post carries none), its callback turns the
-- state into a one-time ticket, and the app API's POST /v1/sign-in {"ticket"} spends the ticket.
--
-- Only the SHA-256 of a state and of a ticket is stored (as for nonces): a copy of these tables
-- gives nobody a value they could present. Each is spent by one DELETE ... RETURNING, so of any
-- number of concurrent callbacks (or redemptions) with the same value exactly one wins. Both are
-- bounded in number and expire (sql/functions/web_sign_in.sql); neither is read by any role
-- directly: the receiver writes and spends states and writes tickets only through SECURITY DEFINER
-- functions, the worker spends tickets through its own.
CREATE TABLE siwa.web_sign_in_states (
    state_hash   bytea       PRIMARY KEY CHECK (length(state_hash) = 32),
    client_id    text        NOT NULL,
    return_to    text        NOT NULL,
    app_state    text        CHECK (length(app_state) <= 512),
    -- The raw nonce: its SHA-256 (hex) went to Apple, the raw value goes to the sign-in.
    nonce        text        NOT NULL,
    redirect_uri text        NOT NULL,
    expires_at   timestamptz NOT NULL
);
CREATE INDEX web_sign_in_states_expiry ON siwa.web_sign_in_states (expires_at);

CREATE TABLE siwa.web_sign_in_tickets (
    ticket_hash        bytea       PRIMARY KEY CHECK (length(ticket_hash) = 32),
    client_id          text        NOT NULL,
    identity_token     text        NOT NULL,
    nonce              text        NOT NULL,
    authorization_code text,
    redirect_uri       text        NOT NULL,
    full_name          jsonb       CHECK (full_name IS NULL OR jsonb_typeof(full_name) = 'object'),
    expires_at         timestamptz NOT NULL
);
CREATE INDEX web_sign_in_tickets_expiry ON siwa.web_sign_in_tickets (expires_at);

-- The worker redeems tickets and prunes both tables (sql/functions/web_sign_in.sql); the receiver
-- gets no privilege on either: its two functions run as their owner.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'siwa_worker') THEN
        EXECUTE 'GRANT SELECT, DELETE ON siwa.web_sign_in_states, siwa.web_sign_in_tickets TO siwa_worker';
    END IF;
END
$$;
