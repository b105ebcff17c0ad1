-- How many times a deletion was requested for the account (siwa.request_deletion, repeats
-- included). A sign-in reads it before asking Apple and hands it back when it writes: a larger
-- count then means a deletion was requested after its read, which must win, even when that
-- request changed nothing visible (the account was already deleted) or its transaction began
-- before the read (timestamps give start order, a counter gives commit order).
-- A constant default: no table rewrite on a live database.
ALTER TABLE siwa.accounts ADD COLUMN deletion_requests bigint NOT NULL DEFAULT 0;
