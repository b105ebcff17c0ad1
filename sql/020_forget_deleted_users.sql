-- Deletion means gone (2026-12-05): an account that reached `deleted` or `apple_account_deleted`
-- forgets its app_user_id (its change rows keep it, so the app still knows whom it deleted). The
-- functions erase it from now on; this erases it from the accounts that got there before.
UPDATE siwa.accounts SET app_user_id = NULL
 WHERE status IN ('deleted', 'apple_account_deleted') AND app_user_id IS NOT NULL;
