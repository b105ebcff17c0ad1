#!/usr/bin/env bash
# Webhook deliveries on this machine, against a throwaway PostgreSQL on 127.0.0.1 (fsync on,
# synchronous_commit on) and a local sink (`siwa webhooks sink`: checks every signature, answers
# 204 at once, records commit-to-delivery delays and per-account order). Stops everything it
# started on exit.
#
#   1. burn-down: CHANGES account changes over ACCOUNTS accounts (several per account, so the
#      per-account ordering is exercised), delivered by 1 and then 2 siwa-worker processes
#   2. delay: RATE changes/s for SECONDS_AT_RATE s (pgbench --rate), one worker listening;
#      p50/p99 of sink receipt - change created_at (the change's transaction)
#   3. peer: pgbench running the workers' own claim + finish SQL (siwa.claim_webhook_deliveries,
#      siwa.finish_webhook_deliveries, 32 a claim) with no HTTP at all, at 1 and 2 connections: the
#      database's ceiling for the same queue work
#
# Targets: >= 1,000 deliveries/s per worker; delay p50 <= 20 ms at 200 changes/s (p99 shown beside it).
# Each run starts from a queue analyzed while empty, then filled (as after a quiet night): the claim
# must not depend on autovacuum having analyzed the backlog.
# Each of these runs twice by default: against the sink over http://, then over https:// (a throwaway
# CA made here, trusted by the workers through SIWA_CA_FILE); SCHEMES="https" runs one.
# Usage: deploy/bench/webhooks.sh   (env: CHANGES=20000, ACCOUNTS=5000, RATE=200, SECONDS_AT_RATE=10, SCHEMES="http https",
#        SIWA_BENCH_BIN=a folder with release siwa and siwa-worker, to skip the build)
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
changes=${CHANGES:-20000}
accounts=${ACCOUNTS:-5000}
rate=${RATE:-200}
rate_seconds=${SECONDS_AT_RATE:-10}
schemes=${SCHEMES:-http https}

# shellcheck source=../scripts/throwaway-postgres.sh
source "$root/deploy/scripts/throwaway-postgres.sh"
if [[ -z "$(pg_throwaway_find_bin)" && $(id -u) -eq 0 ]]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q postgresql postgresql-contrib >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q postgresql postgresql-contrib >/dev/null 2>&1; }
fi

if [[ -n "${SIWA_BENCH_BIN:-}" ]]; then
    bin=$SIWA_BENCH_BIN  # release siwa and siwa-worker built already (a copy, so a build may run meanwhile)
else
    echo "bench: building siwa-worker and siwa (release)"
    (cd "$root" && swift build -c release --product siwa-worker >/tmp/siwa-bench-build.log 2>&1 \
        && swift build -c release --product siwa >>/tmp/siwa-bench-build.log 2>&1) \
        || { tail -20 /tmp/siwa-bench-build.log >&2; exit 1; }
    bin=$(cd "$root" && swift build -c release --show-bin-path)
fi

# track_commit_timestamp: the delay phase splits each change's delay at its commit.
pg_throwaway_start fsync=on synchronous_commit=on track_commit_timestamp=on track_functions=pl || exit 1
pgbench=$PG_BIN/pgbench
[[ -x "$pgbench" ]] || pgbench=$(command -v pgbench)
[[ -x "$pgbench" ]] || { echo "bench: pgbench not found" >&2; exit 1; }
url="postgresql://postgres@127.0.0.1:$PG_PORT/siwa"
psql() { command psql -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U postgres "$@"; }
psql -d postgres -c "CREATE DATABASE siwa"
DATABASE_URL=$url "$bin/siwa" migrate >"$PG_DIR/migrate.log" 2>&1 || { cat "$PG_DIR/migrate.log" >&2; exit 1; }
echo "bench: PostgreSQL $("$PG_BIN/postgres" -V | awk '{print $3}') on 127.0.0.1:$PG_PORT, fsync=on synchronous_commit=on, $(nproc) CPUs"

secret="whsec_$(head -c32 /dev/urandom | base64)"
workers=()
sink_pid=
cleanup() {
    for pid in "${workers[@]}"; do kill -9 "$pid" 2>/dev/null; done
    [[ -n "$sink_pid" ]] && kill -9 "$sink_pid" 2>/dev/null
    pg_throwaway_stop
}
trap cleanup EXIT

# A throwaway CA and a certificate for 127.0.0.1 signed by it, for the https:// runs.
source "$root/deploy/scripts/throwaway-ca.sh"
throwaway_ca "$PG_DIR" sink

start_sink() {  # start_sink http|https: sets sink (its base URL), hook, sink_pid
    local tls=()
    [[ $1 == https ]] && tls=(--tls-cert-file "$PG_DIR/sink.pem" --tls-key-file "$PG_DIR/sink.key")
    [[ -n "$sink_pid" ]] && { kill "$sink_pid" 2>/dev/null; wait "$sink_pid" 2>/dev/null; }
    SIWA_WEBHOOK_SECRET=$secret "$bin/siwa" webhooks sink --listen 127.0.0.1:0 --quiet "${tls[@]}" >"$PG_DIR/sink-$1.log" 2>&1 &
    sink_pid=$!
    for _ in $(seq 100); do grep -q "listening on" "$PG_DIR/sink-$1.log" && break; sleep 0.05; done
    sink=$(grep -o 'https*://[0-9.:]*' "$PG_DIR/sink-$1.log" | head -1)
    [[ -n "$sink" ]] || { echo "bench: the sink did not start" >&2; cat "$PG_DIR/sink-$1.log" >&2; exit 1; }
    hook="$sink/hooks/siwa"
    ca_file=
    [[ $1 == https ]] && ca_file=$PG_DIR/ca.pem
}
start_sink "${schemes%% *}"
# Registered by hand so changes are queued before any worker runs (a worker's start does the same).
psql -d siwa -c "INSERT INTO siwa.webhook_endpoint (endpoint) VALUES ('$hook')"

stats() { curl -s ${ca_file:+--cacert "$ca_file"} "$sink/stats"; }
field() { python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(eval(sys.argv[2], {}, d))" "$1" "$2"; }
reset() {
    psql -d siwa -c "TRUNCATE siwa.jobs, siwa.account_changes"
    psql -d siwa -c "ANALYZE siwa.jobs"
    curl -s ${ca_file:+--cacert "$ca_file"} -X POST "$sink/stats/reset" >/dev/null
}
queue() {  # queue N changes over ACCOUNTS accounts in one INSERT (the trigger queues a delivery each)
    psql -d siwa -c "INSERT INTO siwa.account_changes (client_id, sub, app_user_id, change, status)
        SELECT 'com.example.app', 'sub-' || (i % $accounts), 'user-' || (i % $accounts),
               (ARRAY['email_enabled','email_disabled','consent_revoked'])[1 + i % 3], 'active'
          FROM generate_series(1, $1) AS i ORDER BY i"
}
start_worker() {
    env SIWA_LOG_LEVEL=warn DATABASE_URL=$url SIWA_CLIENT_IDS=com.example.app SIWA_APPLE_CALLS=disabled \
        SIWA_OPS_LISTEN=127.0.0.1:0 SIWA_WEBHOOK_URL=$hook SIWA_WEBHOOK_SECRET=$secret ${ca_file:+SIWA_CA_FILE=$ca_file} \
        "$bin/siwa-worker" 2>>"$PG_DIR/worker.log" &
    workers+=($!)
}
stop_workers() {
    for pid in "${workers[@]}"; do kill -TERM "$pid" 2>/dev/null; done
    for pid in "${workers[@]}"; do wait "$pid" 2>/dev/null; done
    workers=()
}
now() { date +%s.%N; }
undelivered() { psql -d siwa -c "SELECT count(*) FROM siwa.jobs WHERE kind = 'webhook' AND state <> 'completed'"; }
check_books() {  # check_books EXPECTED: every delivery verified, none out of order, none repeated
    local s; s=$(stats)
    local verified bad disorder repeats
    verified=$(field "$s" verified); bad=$(field "$s" bad_signature)
    disorder=$(field "$s" out_of_order); repeats=$(field "$s" repeats)
    [[ "$verified" == "$1" && "$bad" == 0 && "$disorder" == 0 && "$repeats" == 0 ]] \
        || { echo "bench: sink books wrong: expected $1 verified, got $s" >&2; exit 1; }
}

# CPU seconds (user + system) of a process; with "children", also of its reaped children (the
# postmaster: backends of connections that ended, such as psql's and pgbench's).
cpu_s() { awk -v hz="$(getconf CLK_TCK)" -v c="${2:-}" '{print ($14 + $15 + (c ? $16 + $17 : 0)) / hz}' "/proc/$1/stat" 2>/dev/null || echo 0; }
pg_cpu_s() {
    local postmaster; postmaster=$(head -1 "$PG_DIR/data/postmaster.pid")
    { cpu_s "$postmaster" children; for child in $(pgrep -P "$postmaster"); do cpu_s "$child"; done; } | awk '{s += $1} END {print s + 0}'
}
workers_cpu_s() { for pid in "${workers[@]}"; do cpu_s "$pid"; done | awk '{s += $1} END {print s + 0}'; }
# The machine's CPU ticks: busy at normal priority, and in total (niced builds of others are not busy).
ticks() { awk '/^cpu / {print $2 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8}' /proc/stat; }

# Commits, WAL flushes and claim / result-write calls so far (the claim and write counts from
# pg_stat_user_functions: track_functions=pl).
db_counts() {
    psql -d siwa -c "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = 'siwa'),
        (SELECT wal_sync FROM pg_stat_wal),
        coalesce((SELECT calls FROM pg_stat_user_functions WHERE funcname = 'claim_webhook_deliveries'), 0),
        coalesce((SELECT calls FROM pg_stat_user_functions WHERE funcname = 'finish_webhook_deliveries'), 0)" | tr '|' ' '
}

burn_down() {  # burn_down WORKERS -> "deliveries/s worker_us sink_us pg_us busy_% commits wal_flushes claims writes connections" (per delivery; connections: the sink accepted in all)
    reset; queue "$changes"
    local c0; read -r -a c0 <<<"$(db_counts)"
    local pg0 sink0 t0; pg0=$(pg_cpu_s); sink0=$(cpu_s "$sink_pid"); read -r -a t0 <<<"$(ticks)"
    local began; began=$(now)
    for _ in $(seq "$1"); do start_worker; done
    # The sink answers once it has verified them all: no polling query competes with the run.
    curl -s ${ca_file:+--cacert "$ca_file"} "$sink/stats/wait?verified=$changes&seconds=180" >/dev/null
    local ended; ended=$(now)
    local worker_cpu pg1 sink1 t1; worker_cpu=$(workers_cpu_s); pg1=$(pg_cpu_s); sink1=$(cpu_s "$sink_pid"); read -r -a t1 <<<"$(ticks)"
    local deadline=$((SECONDS + 60))
    until [[ $(undelivered) == 0 ]]; do
        (( SECONDS > deadline )) && { echo "bench: burn-down timed out ($(undelivered) left)" >&2; exit 1; }
        sleep 0.05
    done
    stop_workers
    check_books "$changes"
    local connections; connections=$(field "$(stats)" connections)
    sleep 0.5  # the workers' backends report their counts as they exit
    local c1; read -r -a c1 <<<"$(db_counts)"
    python3 -c "n = $changes; print(round(n / ($ended - $began)), round($worker_cpu * 1e6 / n), round(($sink1 - $sink0) * 1e6 / n),
        round(($pg1 - $pg0) * 1e6 / n), round(100 * (${t1[0]} - ${t0[0]}) / max(${t1[1]} - ${t0[1]}, 1)),
        *(f'{(b - a) / n:.3f}' for a, b in zip([$(IFS=,; echo "${c0[*]}")], [$(IFS=,; echo "${c1[*]}")])), $connections)"
}

raw() {  # raw CONNECTIONS -> deliveries/s: the same claim + finish SQL, no HTTP
    reset; queue "$changes"
    cat >"$PG_DIR/raw.sql" <<'SQL'
SELECT coalesce(array_agg(c.job_id), '{}') AS ids, coalesce(array_agg(c.attempt::bigint), '{}') AS attempts
  FROM (SELECT set_config('synchronous_commit', 'off', true)) AS s, siwa.claim_webhook_deliveries('pgbench', 32, 60) AS c \gset
SELECT count(*) FROM siwa.finish_webhook_deliveries(':ids'::bigint[], ':attempts'::bigint[],
    array_fill(204, ARRAY[cardinality(':ids'::bigint[])]),
    array_fill(''::text, ARRAY[cardinality(':ids'::bigint[])]), 86400, 1, 3600);
SQL
    local began; began=$(now)
    local per=$(( changes / 32 / $1 + 10 ))
    until [[ $(undelivered) == 0 ]]; do
        "$pgbench" -n -h 127.0.0.1 -p "$PG_PORT" -U postgres -c "$1" -j "$1" -t "$per" -f "$PG_DIR/raw.sql" siwa \
            >"$PG_DIR/pgbench.log" 2>&1 || { tail -5 "$PG_DIR/pgbench.log" >&2; exit 1; }
        per=20
    done
    local ended; ended=$(now)
    python3 -c "print(round($changes / ($ended - $began)))"
}

# Splits each delivered change's delay at its commit (pg_xact_commit_timestamp of the change's row):
# created_at -> commit is the inserting transaction's own wait (its WAL flush), commit -> the sink's
# receipt is ours (NOTIFY, claim, HTTP). Prints p50/p99/max of both, in ms.
split_delay() {
    curl -s ${ca_file:+--cacert "$ca_file"} "$sink/stats/deliveries" >"$PG_DIR/receipts.csv"
    psql -d siwa <<SQL
CREATE TEMP TABLE receipts (id bigint, at double precision);
\copy receipts FROM '$PG_DIR/receipts.csv' WITH (FORMAT csv)
WITH d AS (
    SELECT extract(epoch FROM pg_xact_commit_timestamp(c.xmin) - c.created_at) * 1000 AS commit_ms,
           (r.at - extract(epoch FROM pg_xact_commit_timestamp(c.xmin))) * 1000 AS after_ms
      FROM receipts r JOIN siwa.account_changes c ON c.id = r.id
)
SELECT format('created_at -> commit (the writer''s own commit): p50 %s ms, p99 %s ms, max %s ms; commit -> sink (NOTIFY, claim, HTTP): p50 %s ms, p99 %s ms, max %s ms',
              round(percentile_cont(0.5) WITHIN GROUP (ORDER BY commit_ms)::numeric, 2),
              round(percentile_cont(0.99) WITHIN GROUP (ORDER BY commit_ms)::numeric, 2),
              round(max(commit_ms)::numeric, 2),
              round(percentile_cont(0.5) WITHIN GROUP (ORDER BY after_ms)::numeric, 2),
              round(percentile_cont(0.99) WITHIN GROUP (ORDER BY after_ms)::numeric, 2),
              round(max(after_ms)::numeric, 2))
  FROM d;
SQL
}

delay() {  # -> "p50_ms p99_ms count" (the split at the commit goes to $PG_DIR/split.txt)
    reset
    start_worker
    for _ in $(seq 100); do
        [[ $(psql -d siwa -c "SELECT count(*) FROM siwa.webhook_endpoint WHERE seen_at > now() - interval '5 seconds'") == 1 ]] && break
        sleep 0.05
    done
    sleep 0.5
    cat >"$PG_DIR/insert.sql" <<'SQL'
INSERT INTO siwa.account_changes (client_id, sub, app_user_id, change, status)
VALUES ('com.example.app', 'sub-' || (random() * 100000)::int, 'user', 'consent_revoked', 'consent_revoked');
SQL
    "$pgbench" -n -h 127.0.0.1 -p "$PG_PORT" -U postgres -c 4 -j 2 -R "$rate" -T "$rate_seconds" -f "$PG_DIR/insert.sql" siwa \
        >"$PG_DIR/pgbench.log" 2>&1
    local deadline=$((SECONDS + 30))
    until [[ $(undelivered) == 0 ]]; do (( SECONDS > deadline )) && break; sleep 0.05; done
    stop_workers
    local total; total=$(psql -d siwa -c "SELECT count(*) FROM siwa.account_changes")
    check_books "$total"
    split_delay >"$PG_DIR/split.txt"
    local s; s=$(stats)
    echo "$(field "$s" "round(delay_ms['p50'], 2)") $(field "$s" "round(delay_ms['p99'], 2)") $total $(field "$s" connections)"
}

echo "bench: $changes changes over $accounts accounts each burn-down run; load at start:$(uptime | sed 's/.*load average://')"
echo "bench: deliveries go through the libcurl client (Sources/OutboundHTTP), keep-alive connections to the sink"
cpu_line() {
    echo "CPU per delivery: worker(s) $2 us, sink $3 us, PostgreSQL $4 us; machine busy $5%"
    echo "      per delivery: $6 commits, $7 WAL flushes, $8 claims, $9 result writes (a claim carries $(python3 -c "print(round(1 / max($8, 1e-9), 1))") on average)"
    echo "      connections the sink accepted: ${10} (TLS handshakes over https; 3 are the bench's own stats calls)"
}
raw1=$(raw 1);       echo "  peer: claim + finish SQL only (pgbench, no HTTP), 1 connection:  $raw1 deliveries/s"
raw2=$(raw 2);       echo "  peer: claim + finish SQL only (pgbench, no HTTP), 2 connections: $raw2 deliveries/s"
summaries=()
for scheme in $schemes; do
    start_sink "$scheme"
    echo "bench: [$scheme] sink at $sink"
    (changes=$((changes / 5)); burn_down 1 >/dev/null)  # warm-up, not reported
    read -r -a one <<<"$(burn_down 1)"; echo "  [$scheme] burn-down, 1 worker process:   ${one[0]} deliveries/s; $(cpu_line "${one[@]}")"
    read -r -a two <<<"$(burn_down 2)"; echo "  [$scheme] burn-down, 2 worker processes: ${two[0]} deliveries/s; $(cpu_line "${two[@]}")"
    one=("${one[@]:0:5}"); two=("${two[@]:0:5}")
    read -r p50 p99 count connections < <(delay)
    echo "  [$scheme] delay at $rate changes/s for ${rate_seconds}s ($count changes, 1 worker): p50 $p50 ms, p99 $p99 ms; the sink accepted $connections connections"
    echo "    split at the change's commit: $(cat "$PG_DIR/split.txt")"
    summaries+=("$scheme|${one[*]}|${two[*]}|$p50|$p99")
done
echo
echo "bench: load at end:$(uptime | sed 's/.*load average://')"
python3 - "$(nproc)" "$raw1" "$raw2" "${summaries[@]}" <<'PY'
import sys
cores = int(sys.argv[1])
raw1, raw2 = float(sys.argv[2]), float(sys.argv[3])
def line(name, value, target, ok):
    print(f"  {name:<46} {value:>12}   target {target:<22} {'OK' if ok else 'BELOW TARGET'}")
def info(name, value, note):
    print(f"  {name:<46} {value:>12}   {note}")
costs = {}
for summary in sys.argv[4:]:
    scheme, one, two, p50, p99 = summary.split("|")
    one, two = ([float(x) for x in a.split()] for a in (one, two))
    p50, p99 = float(p50), float(p99)
    print(f"  sink over {scheme}://")
    line("1 worker", f"{one[0]:.0f}/s", ">= 1000/s", one[0] >= 1000)
    info("  SQL-only peer, 1 connection", f"{raw1:.0f}/s", f"(the database's ceiling; the worker reaches {one[0]/raw1:.0%})")
    line("2 workers, per worker", f"{two[0]/2:.0f}/s", ">= 1000/s", two[0] / 2 >= 1000)
    info("  SQL-only peer, 2 connections, per connection", f"{raw2/2:.0f}/s", f"(the workers reach {two[0]/raw2:.0%})")
    # Every delivery costs CPU in the worker, the sink and PostgreSQL, all on these cores: their sum
    # caps the rate whatever the scheduling (the ceiling), and the part that is not the worker's is
    # what any worker would pay here (the floor).
    _, worker, sink, pg, busy = two
    total = worker + sink + pg
    costs[scheme] = (one[1], worker, sink, pg)
    share = two[0] * total / 1e6 / cores
    info("2 workers: CPU per delivery, all parts", f"{total:.0f} us", f"worker(s) {worker:.0f} + sink {sink:.0f} + PostgreSQL {pg:.0f}")
    info("  share of the machine", f"{share:.0%}", f"used by these parts; the machine was {busy:.0f}% busy at normal priority (the rest: other processes)")
    info("  ceiling on these cores", f"{cores * 1e6 / total:.0f}/s", f"= {cores} cores / {total:.0f} us ({cores * 1e6 / total / 2:.0f} per worker)")
    info("  without the worker's own CPU", f"{cores * 1e6 / (sink + pg):.0f}/s", f"= {cores} cores / (sink + PostgreSQL {sink + pg:.0f} us)")
    line("delay p50 at steady rate", f"{p50:.2f} ms", "<= 20 ms", p50 <= 20)
    info("delay p99 at steady rate", f"{p99:.2f} ms", "(information: no target)")
if "http" in costs and "https" in costs:
    (h1, hw, hs, hp), (s1, sw, ss, sp) = costs["http"], costs["https"]
    print("  CPU per delivery, http:// vs https:// (us): "
          f"worker with 1 process {h1:.0f} vs {s1:.0f}, workers with 2 {hw:.0f} vs {sw:.0f}, sink {hs:.0f} vs {ss:.0f}, PostgreSQL {hp:.0f} vs {sp:.0f}")
PY
