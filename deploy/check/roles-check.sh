#!/usr/bin/env bash
# Checks sql/003_roles.sql against a throwaway PostgreSQL cluster: the three group roles get what
# they need and nothing more, the app-facing functions run as their owner, 003 is harmless when
# applied twice, and a migrating user that may not create roles is told so and still succeeds.
#
# Self-contained: needs the PostgreSQL server binaries and psql (Debian: postgresql, installed with
# apt-get when missing and run as root); picks a free
# port, runs the cluster with deploy/scripts/throwaway-postgres.sh (the benchmarks' starter), stops it at exit.
# Exit status 0 when every check passed, 1 otherwise.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
sql_dir=$(cd "$here/../../sql" && pwd)

find_pg() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }
pg_bin=${PG_BIN:-$(find_pg)}
if [[ -z "$pg_bin" && $(id -u) -eq 0 ]]; then  # Debian: install the server when it is missing
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q postgresql >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q postgresql >/dev/null 2>&1; }
    pg_bin=$(find_pg)
fi
if [[ -z "$pg_bin" || ! -x "$pg_bin/initdb" ]]; then
    echo "roles-check: PostgreSQL server binaries not found (set PG_BIN or install postgresql)" >&2
    exit 1
fi
command -v psql >/dev/null || { echo "roles-check: psql not found" >&2; exit 1; }

# shellcheck source=../scripts/throwaway-postgres.sh
source "$here/../scripts/throwaway-postgres.sh"
PG_BIN=$pg_bin
pg_throwaway_start fsync=off || exit 1
port=$PG_PORT
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; pg_throwaway_stop' EXIT

echo "roles-check: PostgreSQL $("$PG_BIN/postgres" -V | awk '{print $3}') on 127.0.0.1:$port"

passed=0
failed=0
ok()   { passed=$((passed + 1)); echo "  ok    $*"; }
fail() { failed=$((failed + 1)); echo "  FAIL  $*"; }

# q USER DB SQL: run SQL as USER, print the unaligned result; exit status of psql.
q() { psql -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U "$1" -d "$2" -c "$3" 2>"$tmp/err"; }

# allowed USER DB WHAT SQL
allowed() {
    local out
    if out=$(q "$1" "$2" "$4"); then ok "$1 may $3"; else fail "$1 may $3: $(cat "$tmp/err")"; fi
}
# denied USER DB WHAT SQL: must fail with a permission error (not any error)
denied() {
    if q "$1" "$2" "$4" >/dev/null; then
        fail "$1 must not $3, but could"
    elif grep -q 'permission denied' "$tmp/err"; then
        ok "$1 must not $3"
    else
        fail "$1 must not $3: failed for another reason: $(cat "$tmp/err")"
    fi
}
# expect WHAT ACTUAL EXPECTED
expect() { if [[ "$2" == "$3" ]]; then ok "$1"; else fail "$1: got '$2', want '$3'"; fi; }

apply() {  # apply USER DB FILE...: apply SQL files (paths under sql/) in one transaction, like `siwa migrate`
    local user=$1 db=$2; shift 2
    local args=()
    for f in "$@"; do args+=(-f "$sql_dir/$f"); done
    PGOPTIONS="-c check_function_bodies=off" \
        psql -X -q -v ON_ERROR_STOP=1 --single-transaction -h 127.0.0.1 -p "$port" -U "$user" -d "$db" "${args[@]}" 2>&1
}
# Every file `siwa migrate` applies, in its order: the numbered migrations, then the function files.
all_sql=$(cd "$sql_dir" && ls [0-9][0-9][0-9]_*.sql && LC_ALL=C ls functions/*.sql)

privileges() {  # a listing of every privilege in schema siwa, to compare before/after
    q postgres "$1" "
      SELECT c.relname || ':' || coalesce(c.relacl::text, '') FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'siwa' AND c.relkind = 'r'
      UNION ALL
      SELECT 'col ' || c.relname || '.' || a.attname || ':' || a.attacl::text FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
       WHERE n.nspname = 'siwa' AND a.attacl IS NOT NULL
      UNION ALL
      SELECT 'fn ' || p.oid::regprocedure || ':' || coalesce(p.proacl::text, '') || ':' || p.prosecdef
             || ':' || coalesce(p.proconfig::text, '') FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'siwa'
      UNION ALL
      SELECT 'schema:' || nspacl::text FROM pg_namespace WHERE nspname = 'siwa'
      UNION ALL
      SELECT 'role ' || rolname || ':' || rolcanlogin FROM pg_roles WHERE rolname LIKE 'siwa\_%'
      ORDER BY 1"
}

echo "== a migrating user without CREATEROLE (database 'limited')"
q postgres postgres "CREATE ROLE migrator LOGIN NOCREATEROLE NOSUPERUSER" >/dev/null
q postgres postgres "CREATE DATABASE limited OWNER migrator" >/dev/null
# shellcheck disable=SC2086 # one file name a word
if out=$(apply migrator limited $all_sql); then
    ok "every migration and function file applies as a user who may not create roles"
else
    fail "migrations as migrator: $out"
fi
notices=$(grep -c 'may not create roles' <<<"$out")
expect "a NOTICE for each role it could not create" "$notices" 3
expect "no siwa_* role created by it" "$(q postgres postgres "SELECT count(*) FROM pg_roles WHERE rolname LIKE 'siwa\_%'")" 0

echo "== migrating as superuser (database 'siwa')"
q postgres postgres "CREATE DATABASE siwa" >/dev/null
# shellcheck disable=SC2086
if out=$(apply postgres siwa $all_sql); then
    ok "every migration and function file applies as superuser"
else
    fail "migrations as superuser: $out"
fi
expect "three NOLOGIN group roles exist" \
    "$(q postgres postgres "SELECT string_agg(rolname || '=' || rolcanlogin, ',' ORDER BY rolname) FROM pg_roles WHERE rolname LIKE 'siwa\_%'")" \
    "siwa_app=false,siwa_receiver=false,siwa_worker=false"
before=$(privileges siwa)
# A DBA re-running 003's grants re-runs 006 after them (006 narrows what 003 granted the receiver).
if out=$(apply postgres siwa 003_roles.sql 006_hardening.sql); then ok "003 and 006 apply a second time"; else fail "003 and 006 twice: $out"; fi
expect "003 and 006 twice leave the same privileges" "$(privileges siwa)" "$before"
expect "the app-facing functions are SECURITY DEFINER with a fixed search_path" \
    "$(q postgres siwa "SELECT string_agg(proname || ':' || prosecdef || ':' || array_to_string(proconfig, ';'), ',' ORDER BY proname, pronargs)
                       FROM pg_proc WHERE pronamespace = 'siwa'::regnamespace AND proname IN ('account', 'link_account', 'request_deletion')")" \
    "account:true:search_path=pg_catalog, pg_temp,link_account:true:search_path=pg_catalog, pg_temp,request_deletion:true:search_path=pg_catalog, pg_temp,request_deletion:true:search_path=pg_catalog, pg_temp"
expect "every SECURITY DEFINER siwa function pins search_path" \
    "$(q postgres siwa "SELECT coalesce(string_agg(proname, ',' ORDER BY proname), '') FROM pg_proc
                       WHERE pronamespace = 'siwa'::regnamespace AND prosecdef
                         AND NOT coalesce(proconfig::text LIKE '%search_path=%', false)")" ""
# Every other siwa function pins it too, except small LANGUAGE sql expressions the planner inlines
# into the set-based statements (a SET clause stops inlining): they run with their caller's rights,
# name no relation, and resolve only built-ins, which come from pg_catalog before any other schema.
expect "every siwa function pins search_path, but inlined SQL expressions that name no relation" \
    "$(q postgres siwa "SELECT coalesce(string_agg(proname, ',' ORDER BY proname), '') FROM pg_proc p
                       WHERE pronamespace = 'siwa'::regnamespace
                         AND NOT coalesce(proconfig::text LIKE '%search_path=%', false)
                         AND NOT (prolang = (SELECT oid FROM pg_language WHERE lanname = 'sql') AND NOT prosecdef
                                  AND regexp_replace(prosrc, 'distinct\\s+from', '', 'gi')
                                      !~* '\\m(from|join|into|update|delete|insert)\\M')")" ""
echo "  note  inlined, unpinned: $(q postgres siwa "SELECT string_agg(proname, ',' ORDER BY proname) FROM pg_proc
        WHERE pronamespace = 'siwa'::regnamespace AND NOT coalesce(proconfig::text LIKE '%search_path=%', false)")"
expect "the job trigger runs as its owner" \
    "$(q postgres siwa "SELECT prosecdef FROM pg_proc WHERE oid = 'siwa.queue_notification_jobs'::regproc")" t
expect "no siwa function is executable by PUBLIC" \
    "$(q postgres siwa "SELECT count(*) FROM pg_proc p WHERE pronamespace = 'siwa'::regnamespace
                         AND has_function_privilege('public', p.oid, 'EXECUTE')")" 0

# Login users, as an operator would create them.
q postgres postgres "CREATE ROLE rcv LOGIN IN ROLE siwa_receiver; CREATE ROLE wrk LOGIN IN ROLE siwa_worker;
                     CREATE ROLE app LOGIN IN ROLE siwa_app; CREATE ROLE nobody LOGIN" >/dev/null \
    || fail "creating login users: $(cat "$tmp/err")"

echo "== receiver (siwa_receiver)"
insert_n() {  # insert_n JTI TYPE SUB: the receiver's statement
    echo "INSERT INTO siwa.notifications (jti, client_id, sub, event_type, event_time, email, is_private_email, claims, jws)
          VALUES ('$1', 'com.example.app', '$3', '$2', now() - interval '1 minute', 'x@privaterelay.appleid.com', true,
                  '{\"events\": {}}', 'h.p.s')
          ON CONFLICT (jti) DO NOTHING RETURNING jti"
}
allowed rcv siwa "INSERT a notification (ON CONFLICT (jti) DO NOTHING)" "$(insert_n n1 consent-revoked s1)"
expect "the trigger queued exactly one job for it" \
    "$(q postgres siwa "SELECT count(*) FROM siwa.jobs WHERE notification_jti = 'n1' AND kind = 'notification'")" 1
expect "the job of a notification the receiver's role stored is held until a worker verifies it" \
    "$(q postgres siwa "SELECT run_at = 'infinity' FROM siwa.jobs WHERE notification_jti = 'n1'")" t
expect "a redelivered jti returns no row" "$(q rcv siwa "$(insert_n n1 consent-revoked s1)")" ""
expect "a redelivered jti queues no second job" \
    "$(q postgres siwa "SELECT count(*) FROM siwa.jobs WHERE notification_jti = 'n1'")" 1
store="SELECT count(*) FROM siwa.store_notifications(ARRAY['n5', 'n1'], ARRAY['com.example.app', 'com.example.app'],
        ARRAY['s5', 's1'], ARRAY['email-enabled', 'consent-revoked'], ARRAY[1700000000000, 1700000000000]::bigint[],
        ARRAY['x@privaterelay.appleid.com', ''], ARRAY['t', ''], ARRAY['{\"events\": {}}', '{}'], ARRAY['h.p.s', 'h.p.s'])"
expect "the receiver stores a batch through siwa.store_notifications (n1 stored already: one row)" "$(q rcv siwa "$store")" 1
expect "siwa.store_notifications runs as its caller (the receiver's own column privileges)" \
    "$(q postgres siwa "SELECT prosecdef FROM pg_proc WHERE proname = 'store_notifications'")" f
expect "a notification it stored has its job held like any other" \
    "$(q postgres siwa "SELECT run_at = 'infinity' FROM siwa.jobs WHERE notification_jti = 'n5'")" t
count_rejections="SELECT siwa.count_rejections(ARRAY['bad_signature'], ARRAY[1]::bigint[])"
allowed rcv siwa "count a rejection through siwa.count_rejections" "$count_rejections"
allowed rcv siwa "count the same reason again" "$count_rejections"
expect "the counter is 2" "$(q postgres siwa "SELECT count FROM siwa.rejections WHERE reason = 'bad_signature'")" 2
expect "siwa.count_rejections runs as its caller (the receiver's own privileges on the counters)" \
    "$(q postgres siwa "SELECT prosecdef FROM pg_proc WHERE proname = 'count_rejections'")" f
denied nobody siwa "a login without a siwa role counts no rejection" "$count_rejections"
# A compromised receiver forging work: a job for any account, or a notification already marked processed.
denied rcv siwa "INSERT a job directly (a forged notification job)" \
    "INSERT INTO siwa.jobs (kind, priority, client_id, sub, notification_jti) VALUES ('notification', 2, 'com.example.app', 'victim', 'n1')"
denied rcv siwa "INSERT a job directly (a forged revoke)" \
    "INSERT INTO siwa.jobs (kind, client_id, sub) VALUES ('revoke', 'com.example.app', 'victim')"
denied rcv siwa "INSERT a notification marked processed" \
    "INSERT INTO siwa.notifications (jti, client_id, sub, event_type, event_time, claims, jws, processed_at, outcome)
     VALUES ('n9', 'com.example.app', 's9', 'consent-revoked', now(), '{}', 'h.p.s', now(), 'applied')"
denied rcv siwa "SELECT siwa.accounts" "SELECT * FROM siwa.accounts"
denied rcv siwa "SELECT notifications beyond jti" "SELECT email, jws FROM siwa.notifications"
denied rcv siwa "SELECT siwa.jobs" "SELECT * FROM siwa.jobs"
denied rcv siwa "SELECT siwa.account_changes" "SELECT * FROM siwa.account_changes"
denied rcv siwa "call siwa.account_changes_after" "SELECT * FROM siwa.account_changes_after(0, 10)"
denied rcv siwa "UPDATE siwa.notifications" "UPDATE siwa.notifications SET outcome = 'x'"
denied rcv siwa "DELETE siwa.jobs" "DELETE FROM siwa.jobs"
denied rcv siwa "INSERT siwa.accounts" "INSERT INTO siwa.accounts (client_id, sub, status) VALUES ('c', 's', 'active')"
denied rcv siwa "call siwa.apply_notification" "SELECT siwa.apply_notification('n1', 1)"
denied rcv siwa "call siwa.request_deletion" "SELECT siwa.request_deletion('c', 's')"

echo "== web sign-in (receiver keeps and spends states, stores tickets; the worker redeems)"
state_hash="sha256('state-1'::bytea)"
begin_ws="SELECT siwa.begin_web_sign_in($state_hash, 'com.example.app', 'https://app.example.com/done', 'a1', 'raw-nonce-1',
          'https://auth.example.com/apple/sign-in/callback', 10)"
expect "the receiver keeps a state through siwa.begin_web_sign_in" "$(q rcv siwa "$begin_ws")" t
expect "siwa.begin_web_sign_in runs as its owner" \
    "$(q postgres siwa "SELECT prosecdef FROM pg_proc WHERE proname = 'begin_web_sign_in'")" t
expect "the receiver spends it and stores a ticket through siwa.finish_web_sign_in" \
    "$(q rcv siwa "SELECT valid || '/' || return_to || '/' || app_state || '/' || ticket_stored
                   FROM siwa.finish_web_sign_in($state_hash, sha256('ticket-1'::bytea), 'h.p.s', 'c0de', NULL, 10)")" \
    "true/https://app.example.com/done/a1/true"
expect "a spent state is not valid again" \
    "$(q rcv siwa "SELECT valid FROM siwa.finish_web_sign_in($state_hash, NULL, NULL, NULL, NULL, 10)")" f
denied rcv siwa "SELECT siwa.web_sign_in_states" "SELECT * FROM siwa.web_sign_in_states"
denied rcv siwa "SELECT siwa.web_sign_in_tickets" "SELECT * FROM siwa.web_sign_in_tickets"
denied rcv siwa "DELETE siwa.web_sign_in_tickets" "DELETE FROM siwa.web_sign_in_tickets"
denied rcv siwa "INSERT a ticket directly" \
    "INSERT INTO siwa.web_sign_in_tickets (ticket_hash, client_id, identity_token, nonce, redirect_uri, expires_at)
     VALUES (sha256('t'::bytea), 'c', 'h.p.s', 'n', 'https://x', now() + interval '1 hour')"
denied rcv siwa "INSERT a nonce directly" "INSERT INTO siwa.sign_in_nonces VALUES (sha256('n'::bytea), now())"
denied rcv siwa "redeem a ticket (siwa.redeem_web_sign_in_ticket)" "SELECT * FROM siwa.redeem_web_sign_in_ticket(sha256('ticket-1'::bytea))"
denied app siwa "redeem a ticket (siwa.redeem_web_sign_in_ticket)" "SELECT * FROM siwa.redeem_web_sign_in_ticket(sha256('ticket-1'::bytea))"
denied app siwa "keep a state (siwa.begin_web_sign_in)" "$begin_ws"
expect "the worker redeems the ticket once" \
    "$(q wrk siwa "SELECT client_id || '/' || nonce || '/' || authorization_code FROM siwa.redeem_web_sign_in_ticket(sha256('ticket-1'::bytea))")" \
    "com.example.app/raw-nonce-1/c0de"
expect "a redeemed ticket is gone" \
    "$(q wrk siwa "SELECT count(*) FROM siwa.redeem_web_sign_in_ticket(sha256('ticket-1'::bytea))")" 0
expect "the ticket's nonce is a live sign-in nonce, spent by the sign-in" \
    "$(q wrk siwa "SELECT siwa.consume_nonce(sha256('raw-nonce-1'::bytea))")" t
allowed wrk siwa "prune expired states and tickets" "SELECT siwa.prune_web_sign_ins(100)"

echo "== worker (siwa_worker)"
allowed rcv siwa "INSERT a second notification" "$(insert_n n2 email-disabled s2)"
claim="UPDATE siwa.jobs SET state = 'running', attempt = attempt + 1, locked_by = 'check', locked_until = now() + interval '1 minute'
       WHERE id IN (SELECT id FROM siwa.jobs WHERE state = 'available' AND run_at <= now()
                    ORDER BY priority, run_at, id LIMIT 10 FOR UPDATE SKIP LOCKED)
       RETURNING id"
allowed wrk siwa "claim jobs (FOR UPDATE SKIP LOCKED)" "$claim"
job1=$(q postgres siwa "SELECT id FROM siwa.jobs WHERE notification_jti = 'n1'")
job2=$(q postgres siwa "SELECT id FROM siwa.jobs WHERE notification_jti = 'n2'")
expect "apply_notification (consent-revoked)" "$(q wrk siwa "SELECT siwa.apply_notification('n1', $job1)")" applied
expect "apply_notification (email-disabled)" "$(q wrk siwa "SELECT siwa.apply_notification('n2', $job2)")" applied
allowed wrk siwa "complete jobs" "UPDATE siwa.jobs SET state = 'completed', outcome = 'applied', finalized_at = now(), locked_by = NULL, locked_until = NULL WHERE id IN ($job1, $job2)"
allowed wrk siwa "read and update accounts" "UPDATE siwa.accounts SET token_checked_at = now() WHERE client_id = 'com.example.app' RETURNING sub"
allowed wrk siwa "pause a client (siwa.pause_client)" "SELECT siwa.pause_client('com.example.app', 'invalid_client', 300)"
expect "a paused client's jobs wait for its probe (siwa.paused_client_wait)" \
    "$(q wrk siwa "SELECT siwa.paused_client_wait('com.example.app', 300) > 0")" t
expect "unpause a client (siwa.resume_client)" "$(q wrk siwa "SELECT siwa.resume_client('com.example.app')")" t
allowed wrk siwa "store SIWA_APP_GROUPS (siwa.store_app_groups)" "SELECT siwa.store_app_groups(ARRAY['com.example.app'], ARRAY['com.example.app'])"
allowed wrk siwa "register its webhook endpoint and touch it" \
    "SELECT siwa.register_webhook_endpoint('https://app.example/hooks'); SELECT siwa.touch_webhook_endpoint(); SELECT siwa.disable_webhooks()"
allowed wrk siwa "record and fail team transfer import lines" \
    "SELECT count(*) FROM siwa.record_transfer_lines('com.example.app', ARRAY['t1'], ARRAY['u1']); SELECT siwa.transfer_import_failed('com.example.app', 't1', 'check')"
allowed wrk siwa "read account_changes" "SELECT count(*) FROM siwa.account_changes"
allowed wrk siwa "retention: delete processed notifications" "DELETE FROM siwa.notifications WHERE processed_at < now() - interval '30 days'"
allowed wrk siwa "retention: delete finalized jobs" "DELETE FROM siwa.jobs WHERE finalized_at < now() - interval '30 days'"
allowed wrk siwa "retention: delete old rejection counters" "DELETE FROM siwa.rejections WHERE minute < now() - interval '30 days'"
allowed wrk siwa "call siwa.erase_personal_data" "SELECT siwa.erase_personal_data('com.example.app', 'nosuch')"
# The console runs with a worker login and reads accounts as its pages do.
allowed wrk siwa "read accounts as the console does (siwa.find_accounts, siwa.account, siwa.retired_token_count)" \
    "SELECT a.status, siwa.retired_token_count(a.client_id, a.sub) FROM siwa.find_accounts('s1', 100) f
       CROSS JOIN LATERAL siwa.account(f.client_id, f.sub) a"
denied wrk siwa "create objects in schema siwa" "CREATE TABLE siwa.evil (x int)"

echo "== app (siwa_app)"
del1=$(q app siwa "SELECT siwa.request_deletion('com.example.app', 's2')") \
    && ok "app may call siwa.request_deletion (job $del1)" || fail "app request_deletion: $(cat "$tmp/err")"
del2=$(q app siwa "SELECT siwa.request_deletion('com.example.app', 's2')")
expect "calling request_deletion again returns the same job" "$del2" "$del1"
expect "the account is pending_deletion" \
    "$(q postgres siwa "SELECT status FROM siwa.accounts WHERE sub = 's2'")" pending_deletion
link=$(q app siwa "SELECT siwa.link_account('com.example.app', 's3', 'user-3', 'c0de')") \
    && ok "app may call siwa.link_account (job $link)" || fail "app link_account: $(cat "$tmp/err")"
expect "link_account queued an exchange job" \
    "$(q postgres siwa "SELECT kind || '/' || priority FROM siwa.jobs WHERE id = ${link:-0}")" "exchange/0"
expect "app reads account_changes (deletion_requested)" \
    "$(q app siwa "SELECT change FROM siwa.account_changes WHERE sub = 's2' ORDER BY id DESC LIMIT 1")" deletion_requested
expect "app reads the change feed with siwa.account_changes_after" \
    "$(q app siwa "SELECT change FROM siwa.account_changes_after(0, 1000) WHERE sub = 's2' ORDER BY id DESC LIMIT 1")" deletion_requested
expect "app calls siwa.request_deletion with a code, same job" \
    "$(q app siwa "SELECT siwa.request_deletion('com.example.app', 's2', 'c0de')")" "$del1"
expect "app reads its account with siwa.account (no token)" \
    "$(q app siwa "SELECT status || '/' || has_refresh_token FROM siwa.account('com.example.app', 's2')")" "pending_deletion/false"
denied app siwa "call siwa.exchange_succeeded" "SELECT siwa.exchange_succeeded(1, '\\x00', NULL, NULL)"
denied app siwa "SELECT siwa.accounts" "SELECT * FROM siwa.accounts"
denied app siwa "UPDATE siwa.accounts" "UPDATE siwa.accounts SET status = 'active'"
denied app siwa "SELECT siwa.jobs" "SELECT * FROM siwa.jobs"
denied app siwa "UPDATE siwa.jobs" "UPDATE siwa.jobs SET state = 'cancelled'"
denied app siwa "SELECT siwa.notifications" "SELECT * FROM siwa.notifications"
denied app siwa "INSERT siwa.account_changes" "INSERT INTO siwa.account_changes (client_id, sub, change) VALUES ('c', 's', 'x')"
denied app siwa "call siwa.apply_notification" "SELECT siwa.apply_notification('n1', 1)"
denied app siwa "call siwa.record_change" "SELECT siwa.record_change('c', 's', 'x', NULL, NULL, NULL)"
denied app siwa "call siwa.erase_personal_data" "SELECT siwa.erase_personal_data('c', 's')"
denied app siwa "call the console's siwa.find_accounts" "SELECT * FROM siwa.find_accounts('s2', 10)"
# It takes the sub it is given as proven by Apple: only the worker, which verifies the token, may.
denied app siwa "call siwa.claim_transfer (no proof from Apple)" \
    "SELECT siwa.claim_transfer('c', 't', 's', NULL, NULL)"
allowed wrk siwa "call siwa.claim_transfer (after verifying the identity token)" \
    "SELECT siwa.claim_transfer('c', 't', 's', NULL, NULL)"

echo "== a login user in no siwa role"
denied nobody siwa "use schema siwa" "SELECT * FROM siwa.account_changes"
denied nobody siwa "call siwa.request_deletion" "SELECT siwa.request_deletion('c', 's')"

echo "== the limited database, once the roles exist"
if out=$(apply migrator limited 003_roles.sql 006_hardening.sql); then
    ok "003 and 006 re-applied by the user who may not create roles"
else
    fail "003 and 006 again as migrator: $out"
fi
expect "no NOTICE now that the roles exist" "$(grep -c 'may not create roles' <<<"$out")" 0
allowed rcv limited "INSERT a notification there (grants reached existing roles)" "$(insert_n l1 email-enabled s1)"
denied rcv limited "INSERT a job there" \
    "INSERT INTO siwa.jobs (kind, client_id, sub) VALUES ('revoke', 'com.example.app', 'victim')"
allowed app limited "call siwa.request_deletion there" "SELECT siwa.request_deletion('com.example.app', 's1')"
denied app limited "SELECT siwa.accounts there" "SELECT * FROM siwa.accounts"

echo "roles-check: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
