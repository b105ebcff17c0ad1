-- What one event does to an account, as one value: the result type of siwa.account_effect
-- (sql/functions/accounts.sql), the account rules' one function. A type of its own (not OUT
-- parameters, which make a `record`) so the planner can inline the function into the set-based
-- statements that read it.
--   next_status           the status after the event (the status itself when it does not apply)
--   outcome               `applied`, or why not: `no_change`, `ignored_account_deleted`,
--                         `ignored_unknown_type` (the order checks come on top, see the function)
--   ends_grant            the user's grant at Apple is over: the stored tokens are dead, discarded
--   ends_sessions         sessions_revoked_at is set: the app must sign the user out everywhere
--   erases_personal_data  the account's personal data and its notifications' go
--   email_forwarding      what an email event sets email_forwarding to (NULL: not an email event)
--   change                the name of the row appended to siwa.account_changes (NULL: none)
CREATE TYPE siwa.account_effect AS (
    next_status text,
    outcome text,
    ends_grant boolean,
    ends_sessions boolean,
    erases_personal_data boolean,
    email_forwarding text,
    change text
);
