#!/usr/bin/env bash
# Soak: a receiver and two workers (release build) under mixed traffic for a while, with account
# deletions (revokes at a fake Apple) in flight, then the books are checked.
#   deploy/bench/soak.sh [minutes=10]
# Prints every 10 s: throughput, p99 and the RSS of each process; at the end the answers by kind
# and the checks: every 200 stored, every effect applied once, every deletion done, no job stuck.
# Everything on 127.0.0.1; a throwaway PostgreSQL (fsync on); exit 1 if a check fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PATH:/opt/swift/usr/bin"
MINUTES=${1:-10}

deploy/scripts/install-deps.sh >/dev/null
python3 -c 'import cryptography' 2>/dev/null || deploy/scripts/install-deps.sh python3-cryptography >/dev/null
echo "==> building (release)"
for product in siwa siwa-receiver siwa-worker; do swift build -c release --product "$product" >/dev/null; done
BIN=$(swift build -c release --show-bin-path)
work=$(mktemp -d /tmp/siwa-soak.XXXXXX)

source deploy/scripts/throwaway-postgres.sh
pg_throwaway_start fsync=on synchronous_commit=on
children=()
cleanup() {
  for pid in "${children[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pg_throwaway_stop
  rm -rf "$work"
}
trap cleanup EXIT
sql() { psql -X -q -At "$DATABASE_URL" -c "$1"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
"$BIN/siwa" migrate --database-url "$DATABASE_URL" >/dev/null

# The team's .p8: the workers sign client_secrets with it, the fake checks them against it.
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$work/AuthKey_SOAK.p8" 2>/dev/null
fake_port=$(free_port)
"$BIN/siwa" fake-apple --listen "127.0.0.1:$fake_port" --verify-key-file "$work/AuthKey_SOAK.p8" --team-id TEAMSOAK01 \
  >"$work/fake.log" 2>&1 &
children+=($!)
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$fake_port/auth/keys" >/dev/null 2>&1 && break; sleep 0.1; done
curl -fs "http://127.0.0.1:$fake_port/fake/signing-key" >"$work/signing-key.json"
python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pem"])' "$work/signing-key.json" >"$work/signing-key.pem"
kid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["kid"])' "$work/signing-key.json")

port=$(free_port)
DATABASE_URL="$DATABASE_URL" SIWA_CLIENT_IDS=com.example.app SIWA_LISTEN="127.0.0.1:$port" \
  SIWA_APPLE_BASE_URL="http://127.0.0.1:$fake_port" SIWA_LOG_LEVEL=warn \
  "$BIN/siwa-receiver" 2>"$work/receiver.log" &
receiver_pid=$!
children+=($receiver_pid)
worker_pids=()
# One token key for every worker: a token sealed by one must open in the other (found by a soak in
# which each worker drew its own key: the revokes of the other's links kept failing, loudly, and
# the deletions stayed pending, as they must).
token_keys="k1:$(head -c32 /dev/urandom | base64)"
for n in 1 2; do
  DATABASE_URL="$DATABASE_URL" SIWA_CLIENT_IDS=com.example.app SIWA_APPLE_BASE_URL="http://127.0.0.1:$fake_port" \
    SIWA_TEAM_ID=TEAMSOAK01 SIWA_KEY_ID=SOAK SIWA_PRIVATE_KEY_FILE="$work/AuthKey_SOAK.p8" \
    SIWA_TOKEN_KEYS="$token_keys" SIWA_OPS_LISTEN="127.0.0.1:$(free_port)" \
    SIWA_LOG_LEVEL=warn "$BIN/siwa-worker" 2>"$work/worker$n.log" &
  worker_pids+=($!)
  children+=($!)
done
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 0.1; done

# Accounts to delete during the run: one a second, linked now through the fake's codes.
deletions=$(( MINUTES * 60 ))
[[ $deletions -gt 600 ]] && deletions=600
echo "==> linking $deletions accounts (deleted one a second during the run)"
for i in $(seq "$deletions"); do
  code=$(curl -fs -X POST "http://127.0.0.1:$fake_port/fake/codes" -d "{\"client_id\":\"com.example.app\",\"sub\":\"del-$i\"}" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["code"])')
  echo "SELECT siwa.link_account('com.example.app', 'del-$i', 'user-$i', '$code');"
  echo "del-$i" >>"$work/linked.txt"
done | psql -X -q -At "$DATABASE_URL" >/dev/null
for _ in $(seq 600); do
  [[ $(sql "SELECT count(*) FROM siwa.accounts WHERE status = 'active'") -eq $deletions ]] && break; sleep 0.1
done

echo "==> soaking for $MINUTES min: receiver pid $receiver_pid, workers ${worker_pids[*]}"
driver_status=0
python3 deploy/bench/soak-driver.py "$port" "$(( MINUTES * 60 ))" "$kid" "$work/signing-key.pem" "$work" "$DATABASE_URL" \
  "receiver=$receiver_pid,worker1=${worker_pids[0]},worker2=${worker_pids[1]}" || driver_status=$?

echo "==> draining and checking the books"
deleted_count=$(wc -l <"$work/deleted.txt")
for _ in $(seq 1200); do
  [[ $(sql "SELECT count(*) FROM siwa.jobs WHERE state NOT IN ('completed', 'discarded', 'cancelled')") -eq 0 ]] && break
  sleep 0.1
done
sql "CREATE TABLE soak_accepted (jti text PRIMARY KEY)"
psql -X -q "$DATABASE_URL" -c "\\copy soak_accepted FROM '$work/accepted.txt'" 2>/dev/null || \
  grep -v '^$' "$work/accepted.txt" | psql -X -q "$DATABASE_URL" -c "\\copy soak_accepted FROM STDIN"
check() {  # name, query returning 0 when good
  local value; value=$(sql "$2")
  if [[ "$value" == "0" ]]; then printf '  ok    %-48s\n' "$1"; else printf '  FAIL  %-48s %s\n' "$1" "$value"; failed=1; fi
}
failed=0
check "every 200 stored (missing)" "SELECT count(*) FROM soak_accepted a LEFT JOIN siwa.notifications n USING (jti) WHERE n.jti IS NULL"
check "every notification processed (unprocessed)" "SELECT count(*) FROM siwa.notifications WHERE processed_at IS NULL"
check "effect once per notification (jtis with >1 change)" \
  "SELECT count(*) FROM (SELECT notification_jti FROM siwa.account_changes WHERE notification_jti IS NOT NULL GROUP BY 1 HAVING count(*) > 1) d"
check "every deletion done (not deleted)" "SELECT count(*) FROM siwa.accounts WHERE sub LIKE 'del-%' AND status = 'pending_deletion'"
check "one 'deleted' change per deletion (wrong)" \
  "SELECT count(*) FROM (SELECT sub FROM siwa.accounts WHERE status = 'deleted' AND sub LIKE 'del-%') a
    WHERE (SELECT count(*) FROM siwa.account_changes c WHERE c.sub = a.sub AND c.change = 'deleted') <> 1"
check "no job stuck (not completed)" "SELECT count(*) FROM siwa.jobs WHERE state <> 'completed'"
echo "  stored $(sql 'SELECT count(*) FROM siwa.notifications'), answered 200 (fresh) $(sql 'SELECT count(*) FROM soak_accepted'),"\
     "deletions requested $deleted_count, deleted $(sql "SELECT count(*) FROM siwa.accounts WHERE sub LIKE 'del-%' AND status = 'deleted'"),"\
     "revoke calls $(curl -fs "http://127.0.0.1:$fake_port/fake/calls" | python3 -c 'import json,sys; d=json.load(sys.stdin); d=d if isinstance(d, list) else d.get("calls", []); print(sum(1 for c in d if c["endpoint"]=="revoke"))')"
for pid in "$receiver_pid" "${worker_pids[@]}"; do
  kill -0 "$pid" 2>/dev/null || { echo "  FAIL  process $pid died"; failed=1; }
done
[[ $driver_status -eq 0 && $failed -eq 0 ]] && echo "==> soak passed" || { echo "==> soak FAILED"; exit 1; }
