#!/usr/bin/env bash
# Sign-in benchmark. In one run on this machine, on 127.0.0.1 only:
#  1. starts PostgreSQL (fsync and synchronous_commit on), `siwa fake-apple` (checking every
#     client_secret against a fresh .p8, answering at once) and siwa-worker serving the app API
#     (release builds);
#  2. drives it with `siwa simulate sign-in --count N --concurrency C`: each sign-in is
#     POST /v1/nonces, the fake Apple's identity token for the nonce's hash, POST /v1/sign-in with
#     the authorization code (exchanged at Apple, id_token verified, token encrypted, account written);
#  3. drives the Python peer (deploy/bench/python-peer/sign_in.py: the app API's checks with PyJWT,
#     requests and psycopg, from PyPI into a cached virtualenv) the same way, same database, same fake,
#     same driver binary and flags. The peer runs as such a service is run in production: pre-forked
#     worker processes (PEER_PROCESSES, default 2 = one per core here, like gunicorn's gthread workers),
#     each with a thread per connection and a psycopg pool, so the GIL never serialises the 16
#     connections into one process;
#  4. prints sign-ins/s and the sign-in request's p50/p99 for both, next to the targets, and the CPU
#     each process spent per sign-in: the server, the fake Apple, PostgreSQL and the driver. All of
#     them share the machine's cores, so the last three bound what any server can reach here.
# Usage: deploy/bench/sign-in.sh [N=3000] [CONNECTIONS=16]
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PATH:/opt/swift/usr/bin"
N=${1:-3000}
C=${2:-16}
PEER_PROCESSES=${PEER_PROCESSES:-2}

echo "==> building (release)"
swift build -c release --product siwa >/dev/null
swift build -c release --product siwa-worker >/dev/null
BIN=$(swift build -c release --show-bin-path)
work=$(mktemp -d /tmp/siwa-bench-sign-in.XXXXXX)

venv=${SIWA_BENCH_VENV:-$HOME/.cache/siwa-bench-sign-in-venv}
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c 'import jwt, requests, psycopg, psycopg_pool, cryptography' 2>/dev/null; then
  echo "==> installing the Python peer into $venv (pyjwt[crypto], requests, psycopg[binary], psycopg-pool)"
  python3 -m venv "$venv" && "$venv/bin/pip" install -q 'pyjwt[crypto]' requests 'psycopg[binary]' psycopg-pool
fi

source deploy/scripts/throwaway-postgres.sh
pg_throwaway_start fsync=on synchronous_commit=on
children=()
cleanup() {
  # The peer's forked workers are children of its first process: ended by parent id, as they
  # would otherwise outlive the bench (holding its port and any lock fd the bench inherited).
  for pid in "${children[@]}"; do pkill -P "$pid" 2>/dev/null || true; kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pg_throwaway_stop
  rm -rf "$work"
}
trap cleanup EXIT
echo "==> PostgreSQL on 127.0.0.1:$PG_PORT (fsync on, synchronous_commit on)"
"$BIN/siwa" migrate --database-url "$DATABASE_URL" >/dev/null

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_for() { for _ in $(seq 200); do curl -s -o /dev/null "$@" && return 0; sleep 0.1; done; echo "not up: $*" >&2; return 1; }

# One .p8, team and token key for both peers; the fake checks every client_secret against it.
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$work/AuthKey_BENCHKEY01.p8" 2>/dev/null
token_key="b1:$(head -c 32 /dev/urandom | base64 -w0)"
api_token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
export SIWA_CLIENT_IDS=com.example.app SIWA_TEAM_ID=BENCHTEAM1 SIWA_KEY_ID=BENCHKEY01 \
  SIWA_PRIVATE_KEY_FILE="$work/AuthKey_BENCHKEY01.p8" SIWA_TOKEN_KEYS="$token_key" SIWA_APP_API_TOKENS="$api_token"

# CPU seconds (user + system) used so far by the given processes together.
cpu_s() { for pid in "$@"; do awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$pid/stat" 2>/dev/null; done | awk '{s += $1} END {print s + 0}'; }
# PostgreSQL: the postmaster and its backends (the pools keep theirs open for the whole run).
pg_pids() { local pm; pm=$(head -1 "$PG_DIR/data/postmaster.pid"); echo "$pm" $(pgrep -P "$pm"); }
# The machine's CPU ticks: busy at normal priority, and in total (niced builds of others excluded from busy).
ticks() { awk '/^cpu / {print $2 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8}' /proc/stat; }
per_sign_in() { python3 -c "print(f'{($2 - $1) * 1000 / $N:.2f}')"; }
busy_pct() { python3 -c "print(f'{100 * ($3 - $1) / max($4 - $2, 1):.0f}')"; }
fake_port=$(free_port)
"$BIN/siwa" fake-apple --listen "127.0.0.1:$fake_port" --verify-key-file "$work/AuthKey_BENCHKEY01.p8" \
  --team-id BENCHTEAM1 >"$work/fake.log" 2>&1 &
fake_pid=$!
children+=($fake_pid)
wait_for "http://127.0.0.1:$fake_port/auth/keys"
export SIWA_APPLE_BASE_URL="http://127.0.0.1:$fake_port"

api_port=$(free_port); ops_port=$(free_port)
SIWA_APP_API_LISTEN="127.0.0.1:$api_port" SIWA_OPS_LISTEN="127.0.0.1:$ops_port" SIWA_LOG_LEVEL=warn \
  "$BIN/siwa-worker" 2>"$work/worker.log" &
worker_pid=$!
children+=($worker_pid)
wait_for -H "Authorization: Bearer $api_token" "http://127.0.0.1:$api_port/v1/changes"

drive() {  # drive URL SUB_PREFIX COUNT: prints the driver's RESULT line
  SIWA_APP_API_TOKENS="$api_token" "$BIN/siwa" simulate sign-in --client-id com.example.app --sub "$2" --api-url "$1" \
    --fake-apple-url "$SIWA_APPLE_BASE_URL" --email bench@privaterelay.appleid.com --count "$3" --concurrency "$C" \
    2>>"$work/driver.err" | grep '^RESULT' || { cat "$work/driver.err" >&2; return 1; }
}
field() { sed "s/.* $2=\([^ ]*\).*/\1/" <<<"$1"; }

echo "==> warming up (200 sign-ins each side is not measured)"
drive "http://127.0.0.1:$api_port" warm 200 >/dev/null
echo "==> app API: $N sign-ins at $C connections"
cpu_before=$(cpu_s "$worker_pid"); fake_before=$(cpu_s "$fake_pid"); pg_before=$(cpu_s $(pg_pids)); ticks_before=$(ticks)
swift_line=$(drive "http://127.0.0.1:$api_port" swift "$N")
swift_busy=$(busy_pct $ticks_before $(ticks))
swift_cpu=$(per_sign_in "$cpu_before" "$(cpu_s "$worker_pid")")
swift_fake_cpu=$(per_sign_in "$fake_before" "$(cpu_s "$fake_pid")")
swift_pg_cpu=$(per_sign_in "$pg_before" "$(cpu_s $(pg_pids))")
server_p99=$(curl -s "http://127.0.0.1:$ops_port/metrics" | python3 -c '
import re, sys
b = {float(m.group(1)): int(m.group(2)) for m in (re.match(r"siwa_app_api_sign_in_seconds_bucket\{le=\"([^\"]+)\"\} (\d+)", l) for l in sys.stdin) if m}
total = max(b.values()) if b else 0
print(next((f"<= {le * 1000:g} ms" for le, n in sorted(b.items()) if total and n >= 0.99 * total), "n/a"))')
worker_rss=$(awk '/VmRSS/ {printf "%.1f", $2 / 1024}' "/proc/$worker_pid/status")
kill "$worker_pid"; wait "$worker_pid" 2>/dev/null || true

py_port=$(free_port)
PORT=$py_port PROCESSES=$PEER_PROCESSES "$venv/bin/python" deploy/bench/python-peer/sign_in.py >"$work/python.log" 2>&1 &
py_pid=$!
children+=($py_pid)
wait_for -X POST "http://127.0.0.1:$py_port/v1/nonces"
echo "==> Python peer ($PEER_PROCESSES processes): warm-up, then $N sign-ins at $C connections"
drive "http://127.0.0.1:$py_port" pywarm 200 >/dev/null
py_pids=("$py_pid" $(pgrep -P "$py_pid" || true))
cpu_before=$(cpu_s "${py_pids[@]}"); fake_before=$(cpu_s "$fake_pid"); pg_before=$(cpu_s $(pg_pids)); ticks_before=$(ticks)
py_line=$(drive "http://127.0.0.1:$py_port" py "$N")
py_busy=$(busy_pct $ticks_before $(ticks))
py_cpu=$(per_sign_in "$cpu_before" "$(cpu_s "${py_pids[@]}")")
py_fake_cpu=$(per_sign_in "$fake_before" "$(cpu_s "$fake_pid")")
py_pg_cpu=$(per_sign_in "$pg_before" "$(cpu_s $(pg_pids))")
kill "${py_pids[@]}" 2>/dev/null || true

accounts=$(psql -X -At -h 127.0.0.1 -p "$PG_PORT" -U postgres -c "SELECT count(*) FROM siwa.accounts WHERE refresh_token_enc IS NOT NULL")
py_accounts=$(psql -X -At -h 127.0.0.1 -p "$PG_PORT" -U postgres -c "SELECT count(*) FROM peer.accounts WHERE refresh_token_enc IS NOT NULL")
printf '\nSign-in benchmark: %s sign-ins at %s connections, each nonce + fake Apple identity token + sign-in with a code exchange\n' "$N" "$C"
row='%-38s %10s %7s %7s %8s | %7s %7s %7s %7s %6s\n'
printf "$row" "" "sign-ins/s" "p50 ms" "p99 ms" failures server fake pg driver busy
printf "$row" "app API (siwa-worker)" "$(field "$swift_line" rate)" "$(field "$swift_line" p50_ms)" "$(field "$swift_line" p99_ms)" \
  "$(field "$swift_line" failures)" "$swift_cpu" "$swift_fake_cpu" "$swift_pg_cpu" "$(field "$swift_line" driver_cpu_ms)" "$swift_busy%"
printf "$row" "Python peer ($PEER_PROCESSES procs, PyJWT+requests+psycopg)" "$(field "$py_line" rate)" "$(field "$py_line" p50_ms)" "$(field "$py_line" p99_ms)" \
  "$(field "$py_line" failures)" "$py_cpu" "$py_fake_cpu" "$py_pg_cpu" "$(field "$py_line" driver_cpu_ms)" "$py_busy%"
printf 'server/fake/pg/driver: CPU ms per sign-in (nonce + sign-in), user + system, of each process; the last three are shared\n'
printf "busy: the machine's CPU at normal priority during the run (100%% = every core; niced builds of others not counted)\n"
printf 'floor: fake + pg + driver = %s ms per sign-in for the app API run: no server reaches more than %s sign-ins/s on %s cores here\n' \
  "$(python3 -c "print(f'{$swift_fake_cpu + $swift_pg_cpu + $(field "$swift_line" driver_cpu_ms):.2f}')")" \
  "$(python3 -c "print(f'{$(nproc) * 1000 / ($swift_fake_cpu + $swift_pg_cpu + $(field "$swift_line" driver_cpu_ms)):.0f}')")" "$(nproc)"
printf 'load average at the end: %s (2 cores: every figure here shares them with the driver, the fake and PostgreSQL)\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
printf 'p50/p99: the POST /v1/sign-in request as the driver saw it; inside the worker p99 %s\n' "$server_p99"
printf 'accounts with an encrypted refresh token: app API %s, Python peer %s\n' "$accounts" "$py_accounts"
printf 'worker resident memory after its run: %s MB\n' "$worker_rss"
printf 'app API / Python peer: %sx sign-ins/s, %sx less server CPU per sign-in (target >= 5x); app API p99 %s ms (target <= 25 ms)\n' \
  "$(python3 -c "print(f'{$(field "$swift_line" rate) / max($(field "$py_line" rate), 0.001):.1f}')")" \
  "$(python3 -c "print(f'{$py_cpu / max($swift_cpu, 0.001):.1f}')")" "$(field "$swift_line" p99_ms)"
