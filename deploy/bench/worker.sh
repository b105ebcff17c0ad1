#!/usr/bin/env bash
# Worker throughput and latency on this machine, against a throwaway PostgreSQL on 127.0.0.1
# (fsync on, synchronous_commit on). Stops everything it started on exit.
#
#   1. burn-down: 50,000 queued notification jobs, drained by 1 and then 2 siwa-worker processes
#   2. raw SQL limit: pgbench, one transaction = claim 50 (SKIP LOCKED) + write each notification +
#      complete the jobs, at 1, 2 and 4 connections
#   3. effect delay: 500 notifications/s for 10 s (pgbench --rate) with one worker listening;
#      p50/p99 of processed_at - received_at
#   4. procrastinate (PyPI) peer: the same UPDATE of a siwa.notifications row per job, PEER_JOBS jobs
#      drained by 1 and then 2 `procrastinate worker` processes (--concurrency 4, as
#      SIWA_WORKER_CONCURRENCY), from a venv under ~/.cache (SIWA_BENCH_PROCRASTINATE_VENV); when
#      the PyPI install fails the output says so and the ratios are not printed.
#
# Each siwa-worker process runs notification batches on one connection, so N processes are
# compared with the raw peer at N connections.
# Targets: burn-down >= 50 % of the raw rate at the same number of connections; >= 5x procrastinate;
# effect delay p50 <= 10 ms.
# Usage: deploy/bench/worker.sh   (env: JOBS=50000, PEER_JOBS=4000, RATE=500, SECONDS_AT_RATE=10, PG_BIN=...)
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
jobs=${JOBS:-50000}
rate=${RATE:-500}
rate_seconds=${SECONDS_AT_RATE:-10}
peer_jobs=${PEER_JOBS:-4000}

find_pg() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }
pg_bin=${PG_BIN:-$(find_pg)}
if [[ -z "$pg_bin" && $(id -u) -eq 0 ]]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q postgresql postgresql-contrib >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q postgresql postgresql-contrib >/dev/null 2>&1; }
    pg_bin=$(find_pg)
fi
[[ -n "$pg_bin" && -x "$pg_bin/initdb" ]] || { echo "bench: PostgreSQL server binaries not found (PG_BIN)" >&2; exit 1; }
pgbench=$pg_bin/pgbench
[[ -x "$pgbench" ]] || pgbench=$(command -v pgbench)
[[ -x "$pgbench" ]] || { echo "bench: pgbench not found" >&2; exit 1; }

echo "bench: building siwa-worker (release)"
(cd "$root" && swift build -c release --product siwa-worker >/tmp/siwa-bench-build.log 2>&1) \
    || { tail -20 /tmp/siwa-bench-build.log >&2; exit 1; }
worker_bin=$(cd "$root" && swift build -c release --show-bin-path)/siwa-worker

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null \
    || echo $((20000 + RANDOM % 20000)))
tmp=$(mktemp -d)
as_pg=()
if [[ $(id -u) -eq 0 ]]; then chown postgres "$tmp"; as_pg=(runuser -u postgres --); fi
workers=()
cleanup() {
    for pid in "${workers[@]}"; do kill -9 "$pid" 2>/dev/null; done
    "${as_pg[@]}" "$pg_bin/pg_ctl" -D "$tmp/data" -m immediate -w stop >/dev/null 2>&1
    rm -rf "$tmp"
}
trap cleanup EXIT

"${as_pg[@]}" "$pg_bin/initdb" -D "$tmp/data" -A trust -U postgres >"$tmp/initdb.log" 2>&1 \
    || { cat "$tmp/initdb.log" >&2; exit 1; }
"${as_pg[@]}" "$pg_bin/pg_ctl" -D "$tmp/data" -w -l "$tmp/server.log" \
    -o "-c listen_addresses=127.0.0.1 -p $port -k $tmp -c fsync=on -c synchronous_commit=on -c shared_buffers=256MB -c max_connections=50" \
    start >/dev/null || { cat "$tmp/server.log" >&2; exit 1; }
url="postgresql://postgres@127.0.0.1:$port/siwa"
psql() { command psql -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres "$@"; }
psql -d postgres -c "CREATE DATABASE siwa"
migrate() {  # migrate DB: every file `siwa migrate` applies, in its order
    local f
    for f in "$root"/sql/[0-9][0-9][0-9]_*.sql $(LC_ALL=C ls "$root"/sql/functions/*.sql); do
        PGOPTIONS="-c check_function_bodies=off" psql -d "$1" --single-transaction -f "$f" >/dev/null 2>&1 \
            || { echo "bench: $f failed on database $1" >&2; return 1; }
    done
}
migrate siwa || exit 1
echo "bench: PostgreSQL $("$pg_bin/postgres" -V | awk '{print $3}') on 127.0.0.1:$port, fsync=on synchronous_commit=on, $(nproc) CPUs"

reset() {
    psql -d siwa -c "TRUNCATE siwa.notifications, siwa.jobs, siwa.accounts, siwa.account_changes"
    psql -d siwa -c "ANALYZE siwa.jobs"  # statistics of an empty table: the claim must not care
}
queue() {  # queue N notifications in one INSERT (the trigger queues their jobs)
    psql -d siwa -c "INSERT INTO siwa.notifications (jti, client_id, sub, event_type, event_time, email, is_private_email, claims, jws)
        SELECT 'b' || i, 'com.example.app', 'sub-' || (i % 20000),
               (ARRAY['email-enabled','email-disabled','consent-revoked','account-deleted'])[1 + i % 4],
               now() - interval '1 hour' + i * interval '1 ms', 'x@privaterelay.appleid.com', true, '{}'::jsonb, 'h.p.s'
          FROM generate_series(1, $1) AS i"
}
start_worker() {
    SIWA_LOG_LEVEL=warn DATABASE_URL=$url SIWA_CLIENT_IDS=com.example.app SIWA_APPLE_CALLS=disabled \
        SIWA_OPS_LISTEN=127.0.0.1:0 "$worker_bin" 2>>"$tmp/worker.log" &
    workers+=($!)
}
stop_workers() {
    for pid in "${workers[@]}"; do kill -TERM "$pid" 2>/dev/null; done
    for pid in "${workers[@]}"; do wait "$pid" 2>/dev/null; done
    workers=()
}
now() { date +%s.%N; }

burn_down() {  # burn_down WORKERS -> jobs/s
    reset; queue "$jobs"
    local began; began=$(now)
    for _ in $(seq "$1"); do start_worker; done
    local deadline=$((SECONDS + 120))
    until [[ $(psql -d siwa -c "SELECT count(*) FROM siwa.jobs WHERE state <> 'completed'") == 0 ]]; do
        (( SECONDS > deadline )) && { echo "bench: burn-down timed out" >&2; exit 1; }
        sleep 0.05
    done
    local ended; ended=$(now)
    stop_workers
    local wrong; wrong=$(psql -d siwa -c "SELECT count(*) FROM (SELECT notification_jti FROM siwa.account_changes GROUP BY 1 HAVING count(*) > 1) d")
    [[ "$wrong" == 0 ]] || { echo "bench: $wrong notifications applied twice" >&2; exit 1; }
    python3 -c "print(round($jobs / ($ended - $began)))"
}

raw() {  # raw CONNECTIONS -> jobs/s (pgbench)
    reset; queue "$jobs"
    cat >"$tmp/claim.sql" <<'SQL'
BEGIN;
WITH c AS (
    SELECT id, notification_jti FROM siwa.jobs
     WHERE state = 'available' AND kind = 'notification' AND run_at <= now()
     ORDER BY priority, run_at, id LIMIT 50 FOR UPDATE SKIP LOCKED
), n AS (
    UPDATE siwa.notifications n SET processed_at = now(), outcome = 'applied' FROM c WHERE n.jti = c.notification_jti
)
UPDATE siwa.jobs j SET state = 'completed', attempt = j.attempt + 1, finalized_at = now() FROM c WHERE j.id = c.id;
COMMIT;
SQL
    local per=$(( jobs / 50 / $1 ))
    local out; out=$("$pgbench" -n -h 127.0.0.1 -p "$port" -U postgres -c "$1" -j "$1" -t "$per" -f "$tmp/claim.sql" siwa 2>&1)
    local tps; tps=$(echo "$out" | awk '/^tps =/ {print $3}' | head -1)
    python3 -c "print(round($tps * 50))"
}

apply_only() {  # siwa.apply_notification over every job in one statement: the effect function's own ceiling
    reset; queue "$jobs"
    local began; began=$(now)
    psql -d siwa -c "SELECT count(siwa.apply_notification(notification_jti, id)) FROM siwa.jobs" >/dev/null
    local ended; ended=$(now)
    python3 -c "print(round($jobs / ($ended - $began)))"
}

procrastinate_venv=${SIWA_BENCH_PROCRASTINATE_VENV:-$HOME/.cache/siwa-bench-procrastinate}
procrastinate_ready() {  # -> status 0 when the venv has procrastinate and psycopg
    [[ -x "$procrastinate_venv/bin/procrastinate" ]] && return 0
    echo "bench: installing procrastinate into $procrastinate_venv (pip install procrastinate psycopg[binary])" >&2
    python3 -m venv "$procrastinate_venv" >"$tmp/pip.log" 2>&1 \
        && "$procrastinate_venv/bin/pip" install -q procrastinate 'psycopg[binary]' >>"$tmp/pip.log" 2>&1 \
        && [[ -x "$procrastinate_venv/bin/procrastinate" ]] && return 0
    echo "bench: procrastinate install from PyPI FAILED: $(tail -1 "$tmp/pip.log")" >&2
    return 1
}
peer_url="postgresql://postgres@127.0.0.1:$port/peer"
procrastinate_setup() {
    psql -d postgres -c "CREATE DATABASE peer"
    migrate peer || return 1
    (cd "$here/procrastinate-peer" && PYTHONPATH=. PEER_DATABASE_URL=$peer_url "$procrastinate_venv/bin/procrastinate" \
        --app peer.app schema --apply >"$tmp/peer.log" 2>&1) || { cat "$tmp/peer.log" >&2; return 1; }
}
procrastinate_run() {  # procrastinate_run PROCESSES -> jobs/s
    psql -d peer -c "SET client_min_messages = warning; TRUNCATE siwa.notifications, siwa.jobs; TRUNCATE procrastinate_jobs CASCADE"
    psql -d peer -c "INSERT INTO siwa.notifications (jti, client_id, sub, event_type, event_time, email, is_private_email, claims, jws)
        SELECT 'b' || i, 'com.example.app', 'sub-' || i, 'email-enabled', now(), 'x@privaterelay.appleid.com', true, '{}'::jsonb, 'h.p.s'
          FROM generate_series(1, $peer_jobs) AS i"
    (cd "$here/procrastinate-peer" && PYTHONPATH=. PEER_DATABASE_URL=$peer_url "$procrastinate_venv/bin/python" -c "import peer; peer.defer($peer_jobs)") \
        >>"$tmp/peer.log" 2>&1 || { echo "bench: deferring procrastinate jobs failed" >&2; return 1; }
    local began; began=$(now)
    for _ in $(seq "$1"); do
        (cd "$here/procrastinate-peer" && exec env PYTHONPATH=. PEER_DATABASE_URL=$peer_url "$procrastinate_venv/bin/procrastinate" \
            --app peer.app --log-level warning worker --concurrency 4) >>"$tmp/peer.log" 2>&1 &
        workers+=($!)
    done
    local deadline=$((SECONDS + 180))
    until [[ $(psql -d peer -c "SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'") == 0 ]]; do
        (( SECONDS > deadline )) && { echo "bench: procrastinate burn-down timed out" >&2; stop_workers; return 1; }
        sleep 0.05
    done
    local ended; ended=$(now)
    stop_workers
    python3 -c "print(round($peer_jobs / ($ended - $began)))"
}

effect_delay() {  # -> "p50_ms p99_ms"
    reset
    start_worker
    sleep 0.5
    cat >"$tmp/insert.sql" <<'SQL'
INSERT INTO siwa.notifications (jti, client_id, sub, event_type, event_time, email, is_private_email, claims, jws)
VALUES (gen_random_uuid()::text, 'com.example.app', 'sub-' || (random() * 100000)::int, 'email-enabled',
        clock_timestamp(), 'x@privaterelay.appleid.com', true, '{}'::jsonb, 'h.p.s');
SQL
    "$pgbench" -n -h 127.0.0.1 -p "$port" -U postgres -c 4 -j 2 -R "$rate" -T "$rate_seconds" -f "$tmp/insert.sql" siwa >/dev/null 2>&1
    local deadline=$((SECONDS + 30))
    until [[ $(psql -d siwa -c "SELECT count(*) FROM siwa.notifications WHERE processed_at IS NULL") == 0 ]]; do
        (( SECONDS > deadline )) && break
        sleep 0.05
    done
    stop_workers
    psql -d siwa -F ' ' -c "SELECT round((percentile_cont(0.5) WITHIN GROUP (ORDER BY d) * 1000)::numeric, 2),
                                  round((percentile_cont(0.99) WITHIN GROUP (ORDER BY d) * 1000)::numeric, 2), count(*)
                             FROM (SELECT extract(epoch FROM processed_at - received_at) AS d FROM siwa.notifications) x"
}

echo "bench: $jobs queued notification jobs each run"
# Warm-up, not reported: the first run on a fresh database pays for cold caches, autovacuum and
# autoanalyze of the freshly filled tables; the raw peer runs later, on a warm database.
(jobs=$((jobs / 5)); burn_down 1 >/dev/null)
one=$(burn_down 1);   echo "  burn-down, 1 worker process (1 batch connection):    $one jobs/s"
two=$(burn_down 2);   echo "  burn-down, 2 worker processes (2 batch connections): $two jobs/s"
raw1=$(raw 1);        echo "  raw SQL (pgbench), 1 connection:  $raw1 jobs/s"
raw2=$(raw 2);        echo "  raw SQL (pgbench), 2 connections: $raw2 jobs/s"
raw4=$(raw 4);        echo "  raw SQL (pgbench), 4 connections: $raw4 jobs/s"
applied=$(apply_only); echo "  siwa.apply_notification per job, 1 statement: $applied jobs/s (the fallback path's ceiling)"
read -r p50 p99 count < <(effect_delay)
echo "  effect delay at $rate/s for ${rate_seconds}s ($count notifications): p50 $p50 ms, p99 $p99 ms"
peer1=0; peer2=0
if procrastinate_ready && procrastinate_setup; then
    peer1=$(procrastinate_run 1) || peer1=0
    echo "  procrastinate peer, 1 worker process ($peer_jobs jobs, one UPDATE each): $peer1 jobs/s"
    peer2=$(procrastinate_run 2) || peer2=0
    echo "  procrastinate peer, 2 worker processes: $peer2 jobs/s"
else
    echo "  procrastinate peer NOT RUN (see the message above)"
fi
echo
python3 - "$one" "$two" "$raw1" "$raw2" "$raw4" "$p50" "$applied" "$peer1" "$peer2" <<'PY'
import sys
one, two, raw1, raw2, raw4, p50, applied, peer1, peer2 = (float(x) for x in sys.argv[1:])
def line(name, value, target, ok):
    print(f"  {name:<44} {value:>10}   target {target:<28} {'OK' if ok else 'BELOW TARGET'}")
line("1 worker / raw 1 connection", f"{one/raw1:.0%}", ">= 50%", one >= 0.5 * raw1)
line("2 workers / raw 2 connections", f"{two/raw2:.0%}", ">= 50%", two >= 0.5 * raw2)
line("2 workers / raw 1 connection", f"{two/raw1:.0%}", "(information)", True)
line("2 workers / raw 4 connections", f"{two/raw4:.0%}", "(information)", True)
line("1 worker / apply_notification per job", f"{one/applied:.1f}x", "(information)", True)
if peer1 > 0 and peer2 > 0:
    line("1 worker / procrastinate 1 process", f"{one/peer1:.1f}x", ">= 5x", one >= 5 * peer1)
    line("2 workers / procrastinate 2 processes", f"{two/peer2:.1f}x", ">= 5x", two >= 5 * peer2)
else:
    print("  procrastinate ratios: NOT MEASURED (peer did not run)")
line("effect delay p50 at steady rate", f"{p50:.2f} ms", "<= 10 ms", p50 <= 10)
PY
