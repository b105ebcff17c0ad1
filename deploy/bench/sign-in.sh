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
#  5. does all of it twice: with the fake Apple over http://, then over https:// (a throwaway CA made
#     here, trusted through SIWA_CA_FILE by the worker and the driver, REQUESTS_CA_BUNDLE by the peer);
#  6. counts, per sign-in, the thread switches of the server (perf stat context-switches and
#     cpu-migrations; /proc's ctxt_switches where perf is missing) and the worker's heap allocations
#     (malloc-count.c preloaded into it; ALLOCS=0 leaves it out), and prints the statements that cost
#     PostgreSQL most on each side (pg_stat_statements, per sign-in).
#  7. the web flow (WEB=1, the default): a siwa-receiver serving /apple/sign-in beside the same worker;
#     `siwa simulate sign-in --web-url` plays the browser: GET /apple/sign-in, the fake Apple's
#     authorize page (its form read and posted as a browser would), the callback's 303 with a ticket,
#     then POST /v1/sign-in {"ticket"} to the app API. Prints sign-ins/s, the ticket sign-in's p50/p99
#     and CPU per sign-in of the receiver, the worker, PostgreSQL, the fake and the driver, beside the
#     native flow. The Python peer has no web flow (it would be the app's own callback): not compared.
# With PERF=1, a perf profile of the worker during each scheme's run (by library, then by function;
# with two schemes, then where the second costs more than the first, samples per sign-in by library):
# its sampling costs the worker CPU, so the figures of that run are not comparable. PERF_EVENT records
# every occurrence of one event instead, with its stack (kept in /tmp/siwa-bench-sign-in-SCHEME.perf.data,
# read with `perf script`): sched:sched_switch says which wait each thread switch is, and
# probe_libc:malloc (after `perf probe -x /lib/x86_64-linux-gnu/libc.so.6 malloc`) who allocates.
# Usage: deploy/bench/sign-in.sh [N=3000] [CONNECTIONS=16]   (env: SCHEMES="http https", WEB=1, ALLOCS=1, PERF=0, PERF_FREQ=499,
#        PERF_EVENT=, SIWA_BENCH_BIN=a folder with release siwa and siwa-worker, to skip the build)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PATH:/opt/swift/usr/bin"
N=${1:-3000}
C=${2:-16}
PEER_PROCESSES=${PEER_PROCESSES:-2}
ALLOCS=${ALLOCS:-1}
PERF=${PERF:-0}
SCHEMES=${SCHEMES:-http https}
WEB=${WEB:-1}

if [[ -n "${SIWA_BENCH_BIN:-}" ]]; then
  BIN=$SIWA_BENCH_BIN  # siwa and siwa-worker built already (a copy, so a build may run meanwhile)
else
  echo "==> building (release)"
  swift build -c release --product siwa >/dev/null
  swift build -c release --product siwa-worker >/dev/null
  [[ "$WEB" == 1 ]] && swift build -c release --product siwa-receiver >/dev/null
  BIN=$(swift build -c release --show-bin-path)
fi
work=$(mktemp -d /tmp/siwa-bench-sign-in.XXXXXX)

venv=${SIWA_BENCH_VENV:-$HOME/.cache/siwa-bench-sign-in-venv}
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c 'import jwt, requests, psycopg, psycopg_pool, cryptography' 2>/dev/null; then
  echo "==> installing the Python peer into $venv (pyjwt[crypto], requests, psycopg[binary], psycopg-pool)"
  python3 -m venv "$venv" && "$venv/bin/pip" install -q 'pyjwt[crypto]' requests 'psycopg[binary]' psycopg-pool
fi

source deploy/scripts/throwaway-postgres.sh
pg_throwaway_start fsync=on synchronous_commit=on shared_preload_libraries=pg_stat_statements pg_stat_statements.track=all
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
"$BIN/siwa" migrate --database-url "$DATABASE_URL" >"$work/migrate.log" 2>&1 || { cat "$work/migrate.log" >&2; exit 1; }
psql -X -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null

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

# A throwaway CA and a certificate for 127.0.0.1 signed by it, for the https:// runs.
source deploy/scripts/throwaway-ca.sh
throwaway_ca "$work" fake

if [[ "$ALLOCS" == 1 ]]; then
  cc -O2 -shared -fPIC -o "$work/malloc-count.so" deploy/bench/malloc-count.c -ldl
fi
have_perf=0
if command -v perf >/dev/null && perf stat -e context-switches -x, -o /dev/null true 2>/dev/null; then have_perf=1; fi

# Thread switches: a process started with `counted` runs under perf stat, which counts every thread
# it ever has (children and threads started later included; `perf stat -p` would miss those),
# printing the counts every 200 ms; `window_start`/`window_end` mark the run, and `switches_in` sums
# the intervals inside it: "context-switches cpu-migrations". Without perf, 0 0.
counted() {  # counted NAME CMD...: starts CMD in the background, sets counted_pid (CMD's pid)
  if [[ $have_perf == 1 ]]; then
    date +%s.%N >"$work/$1.started"
    perf stat -I 200 -x, -e context-switches,cpu-migrations -o "$work/$1.csv" -- "${@:2}" &
    local perf_pid=$!
    children+=($perf_pid)
    counted_pid=
    for _ in $(seq 100); do counted_pid=$(pgrep -P "$perf_pid" | head -1) && [[ -n "$counted_pid" ]] && break; sleep 0.05; done
  else
    "${@:2}" &
    counted_pid=$!
  fi
  children+=($counted_pid)
}
window_start() { date +%s.%N >"$work/$1.window"; }
window_end() { date +%s.%N >>"$work/$1.window"; }
switches_in() {  # switches_in NAME, once the window is over (the counts of the next interval included)
  [[ $have_perf == 1 ]] || { echo "0 0"; return; }
  sleep 0.5
  python3 - "$work/$1.started" "$work/$1.window" "$work/$1.csv" <<'PY'
import sys
started = float(open(sys.argv[1]).read())
begin, end = (float(x) - started for x in open(sys.argv[2]).read().split())
totals = {"context-switches": 0.0, "cpu-migrations": 0.0}
for line in open(sys.argv[3]):
    parts = line.strip().split(",")
    if len(parts) < 4 or parts[3] not in totals: continue
    t = float(parts[0])
    # An interval ending at t covers (t - 0.2, t]: counted when it overlaps the window.
    # ("<not counted>": an interval in which no thread ran.)
    if t > begin and t - 0.2 < end and parts[1].replace(".", "", 1).isdigit(): totals[parts[3]] += float(parts[1])
print(int(totals["context-switches"]), int(totals["cpu-migrations"]))
PY
}
allocations() {  # allocations bytes, so far, of a worker started with malloc-count.so
  [[ "$ALLOCS" == 1 ]] || { echo "0 0"; return; }
  rm -f "$work/mc.txt"; kill -USR2 "$1"
  for _ in $(seq 50); do [[ -s "$work/mc.txt" ]] && break; sleep 0.05; done
  cat "$work/mc.txt" 2>/dev/null || echo "0 0"
}
per() { python3 -c "print(f'{$1 / $N:.1f}')"; }
pg_top() {  # the statements that cost PostgreSQL most since the last reset, per sign-in
  psql -X -At -F ' | ' -h 127.0.0.1 -p "$PG_PORT" -U postgres -c "
    SELECT to_char(calls::numeric / $N, 'FM990.00') || ' calls', to_char(total_exec_time * 1000 / $N, 'FM99990') || ' us exec',
           to_char(total_plan_time * 1000 / $N, 'FM99990') || ' us plan', left(regexp_replace(query, '\s+', ' ', 'g'), 90)
      FROM pg_stat_statements WHERE query NOT ILIKE '%pg_stat_statements%'
     ORDER BY total_exec_time + total_plan_time DESC LIMIT 10" | sed 's/^/    /'
}
pg_reset() { psql -X -q -At -h 127.0.0.1 -p "$PG_PORT" -U postgres -c "SELECT pg_stat_statements_reset()" >/dev/null; }

drive() {  # drive URL SUB_PREFIX COUNT [FLAGS...]: prints the driver's RESULT line
  SIWA_APP_API_TOKENS="$api_token" "$BIN/siwa" simulate sign-in --client-id com.example.app --sub "$2" --api-url "$1" \
    --fake-apple-url "$SIWA_APPLE_BASE_URL" --email bench@privaterelay.appleid.com --count "$3" --concurrency "$C" "${@:4}" \
    2>>"$work/driver.err" | grep '^RESULT' || { cat "$work/driver.err" >&2; return 1; }
}
web_return=https://app.example.com/signed-in

run_web() {  # run_web SCHEME WORKER_PID API_PORT: the web flow through a receiver beside the running worker
  local scheme=$1 worker_pid=$2 api_port=$3 receiver_port receiver_pid
  receiver_port=$(free_port)
  SIWA_LISTEN="127.0.0.1:$receiver_port" SIWA_PUBLIC_URL="http://127.0.0.1:$receiver_port" SIWA_WEB_RETURN_URLS="$web_return" \
    SIWA_LOG_LEVEL=warn "$BIN/siwa-receiver" 2>"$work/receiver-$scheme.log" &
  receiver_pid=$!
  children+=($receiver_pid)
  wait_for "http://127.0.0.1:$receiver_port/healthz"
  local web=(--web-url "http://127.0.0.1:$receiver_port" --return-to "$web_return")
  echo "==> [$scheme] web flow: warm-up, then $N sign-ins at $C connections (receiver + app API)"
  drive "http://127.0.0.1:$api_port" "webwarm$scheme" 200 "${web[@]}" >/dev/null
  local before_receiver before_worker before_fake before_pg ticks_before line busy
  before_receiver=$(cpu_s "$receiver_pid"); before_worker=$(cpu_s "$worker_pid"); before_fake=$(cpu_s "$fake_pid")
  before_pg=$(cpu_s $(pg_pids)); ticks_before=$(ticks)
  line=$(drive "http://127.0.0.1:$api_port" "web$scheme" "$N" "${web[@]}")
  busy=$(busy_pct $ticks_before $(ticks))
  local receiver_cpu worker_cpu fake_cpu pg_cpu
  receiver_cpu=$(per_sign_in "$before_receiver" "$(cpu_s "$receiver_pid")")
  worker_cpu=$(per_sign_in "$before_worker" "$(cpu_s "$worker_pid")")
  fake_cpu=$(per_sign_in "$before_fake" "$(cpu_s "$fake_pid")")
  pg_cpu=$(per_sign_in "$before_pg" "$(cpu_s $(pg_pids))")
  kill "$receiver_pid"; wait "$receiver_pid" 2>/dev/null || true
  web_report=("$(printf "$row" "web flow (receiver + worker), fake $scheme://" "$(field "$line" rate)" "$(field "$line" p50_ms)" \
    "$(field "$line" p99_ms)" "$(field "$line" failures)" "$(python3 -c "print(f'{$receiver_cpu + $worker_cpu:.2f}')")" "$fake_cpu" "$pg_cpu" \
    "$(field "$line" driver_cpu_ms)" "$busy%" "-" "-")")
  web_report+=("$(printf '  [%s] web flow per sign-in (4 requests: start, authorize, callback, ticket sign-in): receiver %s ms, worker %s ms CPU; p50/p99 are the ticket sign-in'"'"'s' \
    "$scheme" "$receiver_cpu" "$worker_cpu")")
}
field() { sed "s/.* $2=\([^ ]*\).*/\1/" <<<"$1"; }
row='%-44s %10s %7s %7s %8s | %7s %7s %7s %7s %6s | %8s %8s\n'
report=()

run_scheme() {  # run_scheme http|https: the app API, then the peer, against a fake Apple over that scheme
  local scheme=$1 tls=() fake_pid worker_pid py_pid
  unset SIWA_CA_FILE REQUESTS_CA_BUNDLE
  if [[ $scheme == https ]]; then
    tls=(--tls-cert-file "$work/fake.pem" --tls-key-file "$work/fake.key")
    export SIWA_CA_FILE="$work/ca.pem" REQUESTS_CA_BUNDLE="$work/ca.pem"
  fi
  local fake_port; fake_port=$(free_port)
  "$BIN/siwa" fake-apple --listen "127.0.0.1:$fake_port" --verify-key-file "$work/AuthKey_BENCHKEY01.p8" \
    --team-id BENCHTEAM1 "${tls[@]}" >"$work/fake-$scheme.log" 2>&1 &
  fake_pid=$!
  children+=($fake_pid)
  wait_for ${SIWA_CA_FILE:+--cacert "$SIWA_CA_FILE"} "$scheme://127.0.0.1:$fake_port/auth/keys"
  export SIWA_APPLE_BASE_URL="$scheme://127.0.0.1:$fake_port"

  local api_port ops_port preload=()
  api_port=$(free_port); ops_port=$(free_port)
  [[ "$ALLOCS" == 1 ]] && preload=(env LD_PRELOAD="$work/malloc-count.so" MALLOC_COUNT_FILE="$work/mc.txt")
  SIWA_APP_API_LISTEN="127.0.0.1:$api_port" SIWA_OPS_LISTEN="127.0.0.1:$ops_port" SIWA_LOG_LEVEL=warn \
    counted "worker-$scheme" "${preload[@]}" "$BIN/siwa-worker" 2>"$work/worker-$scheme.log"
  worker_pid=$counted_pid
  wait_for -H "Authorization: Bearer $api_token" "http://127.0.0.1:$api_port/v1/changes"

  echo "==> [$scheme] warming up (200 sign-ins each side is not measured)"
  drive "http://127.0.0.1:$api_port" "warm$scheme" 200 >/dev/null
  echo "==> [$scheme] app API: $N sign-ins at $C connections"
  pg_reset
  local allocs_before cpu_before fake_before pg_before ticks_before
  allocs_before=$(allocations "$worker_pid")
  window_start "worker-$scheme"
  if [[ "$PERF" == 1 ]]; then
    if [[ -n "${PERF_EVENT:-}" ]]; then
      perf record -e "$PERF_EVENT" -g -p "$worker_pid" -o "$work/perf-$scheme.data" >/dev/null 2>&1 &
    else
      perf record -F "${PERF_FREQ:-499}" -g -p "$worker_pid" -o "$work/perf-$scheme.data" >/dev/null 2>&1 &
    fi
    perf_record_pid=$!
  fi
  cpu_before=$(cpu_s "$worker_pid"); fake_before=$(cpu_s "$fake_pid"); pg_before=$(cpu_s $(pg_pids)); ticks_before=$(ticks)
  local swift_line swift_busy swift_cpu swift_fake_cpu swift_pg_cpu
  swift_line=$(drive "http://127.0.0.1:$api_port" "swift$scheme" "$N")
  swift_busy=$(busy_pct $ticks_before $(ticks))
  swift_cpu=$(per_sign_in "$cpu_before" "$(cpu_s "$worker_pid")")
  swift_fake_cpu=$(per_sign_in "$fake_before" "$(cpu_s "$fake_pid")")
  swift_pg_cpu=$(per_sign_in "$pg_before" "$(cpu_s $(pg_pids))")
  if [[ "$PERF" == 1 ]]; then kill -INT "$perf_record_pid"; wait "$perf_record_pid" 2>/dev/null || true; fi
  window_end "worker-$scheme"
  local switches allocs_after
  switches=$(switches_in "worker-$scheme")
  allocs_after=$(allocations "$worker_pid")
  local swift_switches swift_allocs swift_alloc_kb
  swift_switches="$(per "${switches% *}")/$(per "${switches#* }")"
  swift_allocs=$(per "$(( ${allocs_after% *} - ${allocs_before% *} ))")
  swift_alloc_kb=$(python3 -c "print(f'{(${allocs_after#* } - ${allocs_before#* }) / 1024 / $N:.1f}')")
  local swift_pg_top; swift_pg_top=$(pg_top)
  local server_p99
  server_p99=$(curl -s "http://127.0.0.1:$ops_port/metrics" | python3 -c '
import re, sys
b = {float(m.group(1)): int(m.group(2)) for m in (re.match(r"siwa_app_api_sign_in_seconds_bucket\{le=\"([^\"]+)\"\} (\d+)", l) for l in sys.stdin) if m}
total = max(b.values()) if b else 0
print(next((f"<= {le * 1000:g} ms" for le, n in sorted(b.items()) if total and n >= 0.99 * total), "n/a"))')
  local worker_rss; worker_rss=$(awk '/VmRSS/ {printf "%.1f", $2 / 1024}' "/proc/$worker_pid/status")
  web_report=()
  [[ "$WEB" == 1 ]] && run_web "$scheme" "$worker_pid" "$api_port"
  kill "$worker_pid"; wait "$worker_pid" 2>/dev/null || true

  local py_port; py_port=$(free_port)
  PORT=$py_port PROCESSES=$PEER_PROCESSES counted "peer-$scheme" "$venv/bin/python" deploy/bench/python-peer/sign_in.py \
    >"$work/python-$scheme.log" 2>&1
  py_pid=$counted_pid
  wait_for -X POST "http://127.0.0.1:$py_port/v1/nonces"
  echo "==> [$scheme] Python peer ($PEER_PROCESSES processes): warm-up, then $N sign-ins at $C connections"
  drive "http://127.0.0.1:$py_port" "pywarm$scheme" 200 >/dev/null
  local py_pids; py_pids=("$py_pid" $(pgrep -P "$py_pid" || true))
  pg_reset
  window_start "peer-$scheme"
  cpu_before=$(cpu_s "${py_pids[@]}"); fake_before=$(cpu_s "$fake_pid"); pg_before=$(cpu_s $(pg_pids)); ticks_before=$(ticks)
  local py_line py_busy py_cpu py_fake_cpu py_pg_cpu
  py_line=$(drive "http://127.0.0.1:$py_port" "py$scheme" "$N")
  py_busy=$(busy_pct $ticks_before $(ticks))
  py_cpu=$(per_sign_in "$cpu_before" "$(cpu_s "${py_pids[@]}")")
  py_fake_cpu=$(per_sign_in "$fake_before" "$(cpu_s "$fake_pid")")
  py_pg_cpu=$(per_sign_in "$pg_before" "$(cpu_s $(pg_pids))")
  window_end "peer-$scheme"
  switches=$(switches_in "peer-$scheme")
  local py_switches="$(per "${switches% *}")/$(per "${switches#* }")"
  local py_pg_top; py_pg_top=$(pg_top)
  kill "${py_pids[@]}" 2>/dev/null || true
  kill "$fake_pid"; wait "$fake_pid" 2>/dev/null || true

  report+=("$(printf "$row" "app API (siwa-worker), fake Apple $scheme://" "$(field "$swift_line" rate)" "$(field "$swift_line" p50_ms)" \
    "$(field "$swift_line" p99_ms)" "$(field "$swift_line" failures)" "$swift_cpu" "$swift_fake_cpu" "$swift_pg_cpu" \
    "$(field "$swift_line" driver_cpu_ms)" "$swift_busy%" "$swift_switches" "$swift_allocs")")
  report+=("${web_report[@]}")
  report+=("$(printf "$row" "Python peer ($PEER_PROCESSES procs), fake Apple $scheme://" "$(field "$py_line" rate)" "$(field "$py_line" p50_ms)" \
    "$(field "$py_line" p99_ms)" "$(field "$py_line" failures)" "$py_cpu" "$py_fake_cpu" "$py_pg_cpu" \
    "$(field "$py_line" driver_cpu_ms)" "$py_busy%" "$py_switches" "-")")
  report+=("$(printf '  [%s] app API / peer: %sx sign-ins/s, %sx less server CPU per sign-in (target >= 5x); app API p99 %s ms (target <= 25 ms), inside the worker p99 %s; worker RSS %s MB, %s KB allocated per sign-in' \
    "$scheme" "$(python3 -c "print(f'{$(field "$swift_line" rate) / max($(field "$py_line" rate), 0.001):.1f}')")" \
    "$(python3 -c "print(f'{$py_cpu / max($swift_cpu, 0.001):.1f}')")" "$(field "$swift_line" p99_ms)" "$server_p99" "$worker_rss" "$swift_alloc_kb")")
  report+=("$(printf '  [%s] PostgreSQL per sign-in, app API (calls, execution, planning, statement):\n%s\n  [%s] PostgreSQL per sign-in, Python peer:\n%s' \
    "$scheme" "$swift_pg_top" "$scheme" "$py_pg_top")")
}

for scheme in $SCHEMES; do run_scheme "$scheme"; done

accounts=$(psql -X -At -h 127.0.0.1 -p "$PG_PORT" -U postgres -c "SELECT count(*) FROM siwa.accounts WHERE refresh_token_enc IS NOT NULL AND sub NOT LIKE 'web%'")
web_accounts=$(psql -X -At -h 127.0.0.1 -p "$PG_PORT" -U postgres -c "SELECT count(*) FROM siwa.accounts WHERE refresh_token_enc IS NOT NULL AND sub LIKE 'web%'")
py_accounts=$(psql -X -At -h 127.0.0.1 -p "$PG_PORT" -U postgres -c "SELECT count(*) FROM peer.accounts WHERE refresh_token_enc IS NOT NULL")
printf '\nSign-in benchmark: %s sign-ins at %s connections a run, each nonce + fake Apple identity token + sign-in with a code exchange\n' "$N" "$C"
printf "$row" "" "sign-ins/s" "p50 ms" "p99 ms" failures server fake pg driver busy switches allocs
for line in "${report[@]}"; do printf '%s\n' "$line"; done
printf 'server/fake/pg/driver: CPU ms per sign-in (nonce + sign-in), user + system, of each process; the last three are shared\n'
printf "busy: the machine's CPU at normal priority during the run (100%% = every core; niced builds of others not counted)\n"
printf 'switches: the server'"'"'s context switches / CPU migrations per sign-in (%s); allocs: the worker'"'"'s heap allocations per sign-in (malloc-count.c preloaded)\n' \
  "$([[ $have_perf == 1 ]] && echo "perf stat over every thread" || echo "perf missing: not counted")"
printf 'accounts with an encrypted refresh token: app API %s (web flow %s), Python peer %s\n' "$accounts" "$web_accounts" "$py_accounts"
printf 'load average at the end: %s (%s cores: every figure here shares them with the driver, the fake and PostgreSQL)\n' "$(cut -d' ' -f1-3 /proc/loadavg)" "$(nproc)"
if [[ "$PERF" == 1 ]]; then
  for scheme in $SCHEMES; do
    cp "$work/perf-$scheme.data" "/tmp/siwa-bench-sign-in-$scheme.perf.data" 2>/dev/null || true
    printf '\nWhere the worker'"'"'s CPU went during the %s run (perf, by library; kept in /tmp/siwa-bench-sign-in-%s.perf.data):\n' "$scheme" "$scheme"
    # `|| true`: head closes the pipe early (SIGPIPE under pipefail).
    perf report -i "$work/perf-$scheme.data" --no-children --sort dso --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -15 || true
    printf '\nHottest functions of the worker (perf, self time):\n'
    perf report -i "$work/perf-$scheme.data" --no-children --sort dso,sym --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -40 || true
  done
  read -r first second _ <<<"$SCHEMES"
  if [[ -n "${second:-}" ]]; then
    # Samples per sign-in by library in each run (the same N, the same frequency): what the second
    # scheme adds, library by library, without comparing shares of two different totals.
    printf '\nSamples per 1,000 sign-ins by library, %s vs %s (same frequency):\n' "$first" "$second"
    python3 - "$work/perf-$first.data" "$work/perf-$second.data" "$N" <<'PY' || true
import subprocess, sys
def by_dso(path):
    out = subprocess.run(["perf", "report", "-i", path, "--no-children", "--sort", "dso", "--stdio", "-g", "none", "-n"],
                         capture_output=True, text=True).stdout
    counts = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0].endswith("%") and parts[1].isdigit():
            counts[" ".join(parts[2:])] = int(parts[1])
    return counts
a, b, n = by_dso(sys.argv[1]), by_dso(sys.argv[2]), int(sys.argv[3])
rows = sorted(set(a) | set(b), key=lambda k: -(b.get(k, 0) - a.get(k, 0)))
for name in rows[:12]:
    print(f"    {a.get(name, 0) * 1000 / n:8.1f} {b.get(name, 0) * 1000 / n:8.1f} {(b.get(name, 0) - a.get(name, 0)) * 1000 / n:+8.1f}  {name}")
print(f"    {sum(a.values()) * 1000 / n:8.1f} {sum(b.values()) * 1000 / n:8.1f} {(sum(b.values()) - sum(a.values())) * 1000 / n:+8.1f}  (all)")
PY
  fi
fi
