#!/usr/bin/env bash
# Receiver benchmark (issue: receiver). In one run on this machine, on 127.0.0.1 only:
#  1. signs N distinct notifications with a local fake Apple key (siwa simulate --output),
#  2. starts PostgreSQL (fsync and synchronous_commit on), the fake Apple's key endpoint and
#     siwa-receiver (release build),
#  3. drives the receiver with wrk at 16, 32 and 64 connections,
#  4. runs pgbench with a single-row INSERT of the same shape at the same concurrency, right before
#     and right after each receiver run (the ratio is against their mean),
#  5. runs the Python peer (deploy/bench/python-peer: uvicorn + PyJWT + psycopg pool, from PyPI into
#     a cached virtualenv) at 64 connections against the same database,
#  6. prints requests/s, p50/p99, non-2xx, rows stored, resident memory and the ratio.
# Usage: deploy/bench/receiver.sh [N=100000] [SECONDS=6]  (N per run; enough that no request repeats)
#        SIWA_BENCH_BIN=a folder with release siwa and siwa-receiver: measures those instead of
#        building (e.g. a copy saved from an earlier commit, to compare two builds on the same day)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PATH:/opt/swift/usr/bin"
N=${1:-100000}
DURATION=${2:-6}
# The issue asks for 16 and 64; its target is stated for 32–64, so 32 is measured too.
CONNECTIONS="16 32 64"

deploy/scripts/install-deps.sh wrk >/dev/null
if [[ -n "${SIWA_BENCH_BIN:-}" ]]; then
  BIN=$SIWA_BENCH_BIN
else
  echo "==> building (release)"
  swift build -c release --product siwa >/dev/null
  swift build -c release --product siwa-receiver >/dev/null
  BIN=$(swift build -c release --show-bin-path)
fi
work=$(mktemp -d /tmp/siwa-bench-receiver.XXXXXX)

source deploy/scripts/throwaway-postgres.sh
# The runs write about 1.5 GB of WAL and 2 GB of rows. Three things would otherwise decide a run's
# tail latency instead of the code under test, whichever peer happened to be running:
#  - a checkpoint in the middle of a run: max_wal_size and checkpoint_timeout leave room for all of it;
#  - backends evicting dirty pages from a small buffer pool: shared_buffers holds all of it;
#  - a brand-new WAL segment: a fresh cluster creates and zero-fills a 16 MB file on the commit path
#    every 16 MB (measured here: 7 commits of 50-100 ms per 64-connection run, p99 50 ms). A server
#    that has been running recycles old segments at each checkpoint instead, so before the runs the
#    benchmark writes 3 GB of WAL and checkpoints it (min_wal_size keeps the recycled files).
# Checkpoints and WAL segments created during the runs are counted in the results.
pg_throwaway_start fsync=on synchronous_commit=on max_wal_size=16GB min_wal_size=3GB checkpoint_timeout=1h \
  shared_buffers=3GB
children=()
cleanup() {
  for pid in "${children[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pg_throwaway_stop
  rm -rf "$work"
}
trap cleanup EXIT
echo "==> PostgreSQL on 127.0.0.1:$PG_PORT (fsync on, synchronous_commit on)"
"$BIN/siwa" migrate --database-url "$DATABASE_URL" >/dev/null
wal_segments() { find "$PG_DIR/data/pg_wal" -maxdepth 1 -type f -name '0*' | wc -l; }
echo "==> recycling 3 GB of WAL segments, as a server that has run for a while has"
psql -X -q -h 127.0.0.1 -p "$PG_PORT" -U postgres <<'SQL'
CREATE TABLE wal_warmup (n int);
DO $$ BEGIN
  FOR i IN 1..192 LOOP INSERT INTO wal_warmup VALUES (i); PERFORM pg_switch_wal(); END LOOP;
END $$;
DROP TABLE wal_warmup;
CHECKPOINT;
CHECKPOINT;
SQL
segments_before=$(wal_segments)
checkpoint_count() {
  psql -X -At -h 127.0.0.1 -p "$PG_PORT" -U postgres -c "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"
}
checkpoints_before=$(checkpoint_count)

fake_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$BIN/siwa" fake-apple --listen "127.0.0.1:$fake_port" >"$work/fake.log" 2>&1 &
children+=($!)
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$fake_port/auth/keys" >/dev/null 2>&1 && break; sleep 0.1; done

echo "==> signing $((4 * N)) notifications"
start=$(date +%s.%N)
for c in $CONNECTIONS; do
  "$BIN/siwa" simulate consent-revoked --client-id com.example.app --count "$N" --output "$work/bodies$c.txt" \
    --fake-apple-url "http://127.0.0.1:$fake_port" --sub-prefix "c$c-"
done
"$BIN/siwa" simulate consent-revoked --client-id com.example.app --count "$N" --output "$work/bodiespy.txt" \
  --fake-apple-url "http://127.0.0.1:$fake_port" --sub-prefix py-
echo "    signed in $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
DATABASE_URL="$DATABASE_URL" SIWA_CLIENT_IDS=com.example.app SIWA_LISTEN="127.0.0.1:$port" \
  SIWA_APPLE_BASE_URL="http://127.0.0.1:$fake_port" SIWA_LOG_LEVEL=warn \
  "$BIN/siwa-receiver" 2>"$work/receiver.log" &
receiver_pid=$!
children+=($receiver_pid)
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
url="http://127.0.0.1:$port/apple/notifications"

rss_mb() { awk '/VmRSS/ {printf "%.1f", $2 / 1024}' "/proc/$1/status"; }
# CPU seconds (user + system) a process has used so far.
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat"; }
# The peer: one single-row INSERT per transaction into a table of the same shape, from pgbench.
# It runs right before and right after each receiver run at the same concurrency, and the ratio is
# taken against the mean of the two: this disk's fsync rate drifts by half within minutes.
psql -X -q -h 127.0.0.1 -p "$PG_PORT" -U postgres <<'SQL'
CREATE TABLE bench_notifications (LIKE siwa.notifications INCLUDING DEFAULTS INCLUDING INDEXES);
SQL
sample_jws=$(head -1 "$work/bodies16.txt" | python3 -c 'import json,sys; print(json.load(sys.stdin)["payload"])')
cat >"$work/insert.sql" <<SQL
INSERT INTO bench_notifications (jti, client_id, sub, event_type, event_time, claims, jws)
VALUES (md5(random()::text || clock_timestamp()::text), 'com.example.app', 'sub', 'consent-revoked', now(),
        '{"iss":"https://appleid.apple.com","aud":"com.example.app","events":"{}"}', '$sample_jws');
SQL
# pgbench_tps CONNECTIONS NAME: prints tx/s; leaves per-transaction latencies in $work/NAME.* (--log).
pgbench_tps() {
  (cd "$work" && "$PG_BIN/pgbench" -n -h 127.0.0.1 -p "$PG_PORT" -U postgres -c "$1" -j 2 -T "$DURATION" \
    --log --log-prefix="$2" -f "$work/insert.sql" postgres 2>/dev/null) | awk '/^tps/ {print $3; exit}'
}
# p99 in ms of the transactions pgbench logged under NAME (third field: latency in microseconds),
# as logged and as wrk would report it. wrk (4.x) corrects for coordinated omission before it
# reports: each sample of n us adds samples n-e, n-2e, ... > e, where e is the run's mean interval
# between a connection's requests. So one 100 ms commit stall under 64 connections, 64 slow
# requests on the wire, becomes about 1,300 samples in wrk's p99. The same correction is applied to
# pgbench's log so that both peers' tails are read alike. Prints "LOGGED CORRECTED".
pgbench_p99() {
  cat "$work/$1".* | awk '{print $3}' | python3 -c '
import sys
samples = [int(line) for line in sys.stdin]
connections, seconds = int(sys.argv[1]), 2 * float(sys.argv[2])  # two pgbench runs per NAME
expected = int(seconds * 1e6 / max(1, len(samples) / connections))
corrected = list(samples)
for n in samples:
    m = n - expected
    while n >= 2 * expected and m > expected:
        corrected.append(m)
        m -= expected
def p99(values):
    values.sort()
    return values[max(0, int(len(values) * 0.99) - 1)] / 1000
print(f"{p99(samples):.2f} {p99(corrected):.2f}")' "$2" "$DURATION"
}
# Autovacuum wakes for a table once a fifth of it is new rows: left alone, the vacuum that the
# previous run's inserts earned runs during the next run, whichever peer that is. Vacuuming before
# each run puts that work between the measurements (what a run's own inserts earn still counts).
# "commits slow": the receiver's commits and those over 25 ms so far, from its /metrics histogram.
# (read from a snapshot taken with metrics_snapshot NAME)
commit_counts() {
  awk '
    /^siwa_receiver_commit_seconds_count/ {total=$2}
    /^siwa_receiver_commit_seconds_bucket\{le="0.025"\}/ {fast=$2}
    END {printf "%d %d\n", total, total - fast}' "$work/$1.metrics"
}
# Server-side quantiles for one run: the p99 bucket bound of a histogram, from /metrics snapshots
# taken before and after the run (so earlier runs do not count).
metrics_snapshot() { curl -s "http://127.0.0.1:$port/metrics" >"$work/$1.metrics"; }
server_p99() {
  python3 - "$work/$1.metrics" "$work/$2.metrics" "$3" <<'PY'
import re, sys
def buckets(path, name):
    found = {}
    for line in open(path):
        m = re.match(name + r'_bucket\{le="([^"]+)"\} (\d+)', line)
        if m: found[m.group(1)] = int(m.group(2))
    return found
before, after = buckets(sys.argv[1], sys.argv[3]), buckets(sys.argv[2], sys.argv[3])
counts = [(float(le), after[le] - before.get(le, 0)) for le in after]
counts.sort()
total = counts[-1][1] if counts else 0
bound = next((le for le, n in counts if total and n >= 0.99 * total), float("nan"))
print("n/a" if total == 0 else ("> 10 s" if bound == float("inf") else f"<= {bound * 1000:g} ms"))
PY
}
settle() { psql -X -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -c "VACUUM (ANALYZE)" >/dev/null; }
declare -A server rps p50 p99 non2xx pg_before pg_after pg_tps pg_p99 cpu_us requests_at commits
for c in $CONNECTIONS; do
  settle
  pg_before[$c]=$(pgbench_tps "$c" "pg$c")
  settle
  metrics_snapshot "before$c"
  read -r commits_before slow_before < <(commit_counts "before$c")
  cpu_before=$(cpu_s "$receiver_pid")
  # PROFILE=1: sample the receiver's CPU (software clock) during the 64-connection run.
  if [[ "${PROFILE:-0}" == 1 && $c == 64 ]]; then
    perf record -e cpu-clock -F 2000 -g -p "$receiver_pid" -o "${PROFILE_OUT:-/tmp/siwa-receiver.perf}" \
      -- sleep "$DURATION" >/dev/null 2>&1 &
  fi
  BODIES_FILE="$work/bodies$c.txt" WRK_THREADS=2 wrk -t2 -c"$c" -d"${DURATION}s" --latency \
    -s deploy/bench/post-bodies.lua "$url" >"$work/wrk$c.txt" 2>&1
  line=$(grep '^RESULT' "$work/wrk$c.txt")
  rps[$c]=$(sed 's/.*rps=\([0-9.]*\).*/\1/' <<<"$line")
  p50[$c]=$(sed 's/.*p50_ms=\([0-9.]*\).*/\1/' <<<"$line")
  p99[$c]=$(sed 's/.*p99_ms=\([0-9.]*\).*/\1/' <<<"$line")
  non2xx[$c]=$(sed 's/.*non2xx=\([0-9]*\).*/\1/' <<<"$line")
  requests=$(sed 's/.*requests=\([0-9]*\).*/\1/' <<<"$line")
  requests_at[$c]=$requests
  metrics_snapshot "after$c"
  read -r commits_after slow_after < <(commit_counts "after$c")
  server[$c]="answer $(server_p99 "before$c" "after$c" siwa_receiver_request_seconds), waiting for a commit $(server_p99 "before$c" "after$c" siwa_receiver_commit_wait_seconds), commit $(server_p99 "before$c" "after$c" siwa_receiver_commit_seconds)"
  commits[$c]="$((commits_after - commits_before)) ($((slow_after - slow_before)) > 25 ms)"
  cpu_us[$c]=$(python3 -c "print(round(($(cpu_s "$receiver_pid") - $cpu_before) * 1e6 / max(1, $requests)))")
  settle
  pg_after[$c]=$(pgbench_tps "$c" "pg$c")
  read -r pg_p99_logged pg_p99_corrected < <(pgbench_p99 "pg$c" "$c")
  pg_p99[$c]="$pg_p99_logged / $pg_p99_corrected"
  pg_tps[$c]=$(python3 -c "print(round((${pg_before[$c]} + ${pg_after[$c]}) / 2))")
done
receiver_rss=$(rss_mb "$receiver_pid")
segments_created=$(( $(wal_segments) - segments_before ))
checkpoints=$(( $(checkpoint_count) - checkpoints_before ))
autovacuums=$(psql -X -At -h 127.0.0.1 -p "$PG_PORT" -U postgres -c "SELECT coalesce(sum(autovacuum_count + autoanalyze_count), 0) FROM pg_stat_user_tables")
stored=$(psql -X -At -h 127.0.0.1 -p "$PG_PORT" -U postgres -c "SELECT count(*) FROM siwa.notifications")
jobs=$(psql -X -At -h 127.0.0.1 -p "$PG_PORT" -U postgres -c "SELECT count(*) FROM siwa.jobs")
kill "$receiver_pid"; wait "$receiver_pid" 2>/dev/null || true

# The Python peer, same database, same wrk settings at 64 connections.
venv=${SIWA_BENCH_VENV:-$HOME/.cache/siwa-bench-venv}
if [[ ! -x "$venv/bin/uvicorn" ]]; then
  echo "==> installing the Python peer into $venv (uvicorn, pyjwt[crypto], psycopg[binary], psycopg-pool)"
  python3 -m venv "$venv" && "$venv/bin/pip" install -q uvicorn 'pyjwt[crypto]' 'psycopg[binary]' psycopg-pool
fi
py_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
DATABASE_URL="$DATABASE_URL" SIWA_CLIENT_IDS=com.example.app SIWA_APPLE_BASE_URL="http://127.0.0.1:$fake_port" \
  "$venv/bin/uvicorn" --app-dir deploy/bench/python-peer receiver:app --host 127.0.0.1 --port "$py_port" \
  --workers 2 --no-access-log --log-level warning >"$work/python.log" 2>&1 &
py_pid=$!
children+=($py_pid)
for _ in $(seq 150); do curl -s -o /dev/null "http://127.0.0.1:$py_port/" && break; sleep 0.1; done
BODIES_FILE="$work/bodiespy.txt" WRK_THREADS=2 wrk -t2 -c64 -d"${DURATION}s" --latency \
  -s deploy/bench/post-bodies.lua "http://127.0.0.1:$py_port/apple/notifications" >"$work/wrkpy.txt" 2>&1
py_line=$(grep '^RESULT' "$work/wrkpy.txt")
py_rps=$(sed 's/.*rps=\([0-9.]*\).*/\1/' <<<"$py_line")
py_p99=$(sed 's/.*p99_ms=\([0-9.]*\).*/\1/' <<<"$py_line")
py_non2xx=$(sed 's/.*non2xx=\([0-9]*\).*/\1/' <<<"$py_line")
kill "$py_pid" 2>/dev/null; wait "$py_pid" 2>/dev/null || true

printf '\nReceiver benchmark (%s distinct signed notifications per run, %ss per run, 2 wrk threads)\n' "$N" "$DURATION"
printf '%-6s %12s %9s %9s %8s %10s %20s %15s %8s  %s\n' conns "receiver r/s" "p50 ms" "p99 ms" non2xx "cpu us/req" "pgbench before/after" "pgbench p99" ratio "targets"
for c in $CONNECTIONS; do
  ratio=$(python3 -c "print(f'{${rps[$c]} / ${pg_tps[$c]}:.2f}')")
  printf '%-6s %12s %9s %9s %8s %10s %20s %15s %8s  %s\n' "$c" "${rps[$c]}" "${p50[$c]}" "${p99[$c]}" "${non2xx[$c]}" \
    "${cpu_us[$c]}" "${pg_before[$c]%.*} / ${pg_after[$c]%.*}" "${pg_p99[$c]}" "$ratio" "$(case $c in 16) echo "(information)";; 32) echo "ratio >= 0.80";; 64) echo "ratio >= 0.80; p99 <= 20 ms";; esac)"
done
printf 'p99 ms: the receiver'"'"'s is wrk'"'"'s (corrected for coordinated omission); pgbench'"'"'s is "as logged / corrected the same way"\n'
printf 'rows stored: %s notifications, %s jobs (one job per notification)\n' "$stored" "$jobs"
printf 'during the runs: %s checkpoints, %s autovacuum/autoanalyze passes, %s WAL segments created (%s recycled ones ready)\n' \
  "$checkpoints" "$autovacuums" "$segments_created" "$segments_before"
for c in $CONNECTIONS; do
  printf 'run at %s connections: %s requests for %s distinct notifications (beyond that, redeliveries: 200, no insert); %s commits\n' \
    "$c" "${requests_at[$c]}" "$N" "${commits[$c]}"
  printf '    p99 inside the receiver: %s\n' "${server[$c]}"
done
printf 'receiver resident memory after the runs: %s MB (target <= 64 MB)\n' "$receiver_rss"
printf 'python peer at 64 connections (uvicorn x2 + PyJWT + psycopg pool): %s r/s, p99 %s ms, non2xx %s\n' "$py_rps" "$py_p99" "$py_non2xx"
printf 'receiver / python at 64 connections: %sx (target >= 5x)\n' "$(python3 -c "print(f'{${rps[64]} / $py_rps:.1f}')")"
