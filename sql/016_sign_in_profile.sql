-- Sign-in on every platform: what Apple tells the client about the user once, kept on the account.
-- `full_name`: the name Apple hands the client on the first authorization only (native `fullName`,
-- the web `user` field), as an object of the six optional members the app API accepts.
-- `real_user_status`: the identity token's anti-fraud signal, as shown (`unsupported`, `unknown`,
-- `likely_real`). Both are personal data: erased when the account reaches `deleted` or
-- `apple_account_deleted` (siwa.erase_personal_data, siwa.apply_notifications).
-- Nullable without defaults: no table rewrite on a live database.
ALTER TABLE siwa.accounts
    ADD COLUMN full_name jsonb CHECK (full_name IS NULL OR jsonb_typeof(full_name) = 'object'),
    ADD COLUMN real_user_status text CHECK (real_user_status IN ('unsupported', 'unknown', 'likely_real'));

-- siwa.account(...) shows both (sql/functions/accounts.sql selects them).
ALTER TYPE siwa.account_view ADD ATTRIBUTE full_name jsonb, ADD ATTRIBUTE real_user_status text;
