#!/usr/bin/env bash
# Worker throughput, in one run on this machine against a throwaway PostgreSQL on
# 127.0.0.1 (fsync on, synchronous_commit on); stops everything it started on exit.
#
# Four mixes, each drained by 1 and by 2 siwa-worker processes (release build) and, right before and
# right after them, by raw SQL doing the same writes set-based (deploy/bench/raw-peer/*.sql, pgbench
# at RAW_CONNECTIONS=4 connections; the ratio is against the mean of the two raw runs). The same
# writes include the revoke jobs (b)'s ending events queue for the accounts' tokens; the raw peer
# queued none of them before 6 December 2026, so its (b) figures before then are of less work:
#   (a) unseen: N notifications, each for a sub the database has not seen (the account is created);
#   (b) linked: N notifications, each for an account linked before (token, email, app_user_id);
#   (c) hot:    N/100 linked accounts with 100 email events each, queued out of event_time order;
#   (d) apple:  N notifications as in (a) plus APPLE_JOBS exchange jobs (codes from the fake Apple,
#               `siwa fake-apple`) and APPLE_JOBS revoke jobs (accounts linked through the fake) in
#               the queue at the same time; the raw peer writes what those jobs write but cannot make
#               their HTTP calls (raw-peer/apple.sql).
# Every notification takes the production path after the receiver: it is signed RS256 by the fake
# Apple's key (sign-held.py, cached under ~/.cache) and stored with a siwa_receiver login, so the
# trigger holds its job until a worker has verified the stored jws and every column against its
# claims (StoredNotificationGate); the raw peer reads the same held rows with their jws, but the RSA
# verification is CPU no SQL can do for it.
# Rates: jobs / (the last job's finalized_at - the moment the processes were started), for the
# worker and the raw peer alike. Each worker run is checked: every job completed, every notification
# processed, no change row twice. RSS: each worker process's peak (VmHWM). CPU per job: what
# PostgreSQL (every server process) and the workers used during the run, divided by its jobs; it
# holds better than rates on a loaded machine.
# Then a profile of worker runs (PROFILE_RUNS, mix (a) with one process and (c) with one and two
# by default): the workers' batch histograms, pg_stat_statements with the plpgsql's own statements,
# the WAL fsyncs. Then the effect delay at a steady RATE=1000
# notifications/s for RATE_SECONDS, one worker process: steady-driver.py posts distinct signed
# notifications to a real siwa-receiver on a fixed schedule (the rate it achieved is printed); the
# delay runs from the receiver's 200 (after its commit) to the commit of the effect
# (track_commit_timestamp of the change row), through held -> verified -> applied. Then the procrastinate (PyPI) peer: one job per notification doing the same
# writes (procrastinate-peer/peer.py), 1 and 2 processes (--concurrency 4, as SIWA_WORKER_CONCURRENCY),
# from a venv under ~/.cache (SIWA_BENCH_PROCRASTINATE_VENV); if PyPI fails the output says so.
#
# Why 2 processes are barely faster than 1 (CPU-bound on 2 cores; a second process adds no core,
# only contention), and the runs before and after the batch's SQL changes: deploy/bench/README.md.
# Targets: 2 worker processes >= 50 % of raw at 4 connections on (a)-(c), one process
# >= 40 %; >= 20x procrastinate; effect delay p50 <= 5 ms, p99 <= 20 ms at 1,000/s; RSS <= 64 MB.
# The machine is shared: run it when `uptime` is low, and compare ratios, not absolute figures.
# Usage: deploy/bench/worker.sh   (env: N=20000 REPEAT=1 MIXES="a b c d" APPLE_JOBS=200 RATE=1000
#   WORKER_LOG_LEVEL=warn KEEP_LOGS=dir SLOW_PLANS_MS=N RATE_SECONDS=10 WARMUP_SECONDS=2 PEER_JOBS=3000 RAW_CONNECTIONS=4 NO_PEER=1 NO_PROFILE=1 NO_DELAY=1 DELAY_PROFILE=1 PROFILE_RUNS="a:1 c:1 c:2" PERF=1 WORKER_BIN=path COMPARE_BIN=path
#   MIGRATE_BIN=path SIWA_BENCH_CACHE=dir;
#   SIWA_* worker settings pass through)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PATH:/opt/swift/usr/bin"
N=${N:-20000}
REPEAT=${REPEAT:-1}
MIXES=${MIXES-a b c d}  # MIXES= (empty): no mix runs, only the profile and the delay
APPLE_JOBS=${APPLE_JOBS:-200}
RATE=${RATE:-1000}
RATE_SECONDS=${RATE_SECONDS:-10}
WARMUP_SECONDS=${WARMUP_SECONDS:-2}
PEER_JOBS=${PEER_JOBS:-3000}
RAW_CONNECTIONS=${RAW_CONNECTIONS:-4}
here=deploy/bench

deploy/scripts/install-deps.sh >/dev/null
echo "==> building (release)"
for product in siwa siwa-worker siwa-receiver; do swift build -c release --product "$product" >/dev/null; done
BIN=$(swift build -c release --show-bin-path)
# WORKER_BIN: another siwa-worker build to measure. COMPARE_BIN: a second build (e.g. one saved
# before a change), run on every mix beside the first, against the same raw runs.
worker_bin=${WORKER_BIN:-$BIN/siwa-worker}
compare_bin=${COMPARE_BIN:-}
# MIGRATE_BIN: the siwa build whose SQL the database gets (with WORKER_BIN, an older release whole).
migrate_bin=${MIGRATE_BIN:-$BIN/siwa}
work=$(mktemp -d /tmp/siwa-bench-worker.XXXXXX)

source deploy/scripts/throwaway-postgres.sh
# No checkpoint inside a run (max_wal_size, checkpoint_timeout; each run starts after one), buffers
# for every row, and WAL segments recycled before the runs (a fresh cluster zero-fills a new 16 MB
# segment on the commit path: see receiver.sh). track_commit_timestamp dates each effect's commit.
pg_throwaway_start fsync=on synchronous_commit=on max_wal_size=16GB min_wal_size=1GB checkpoint_timeout=1h \
  shared_buffers=1GB track_commit_timestamp=on shared_preload_libraries=pg_stat_statements
# SLOW_PLANS_MS=N: every statement (nested ones too) slower than N ms is logged with its plan,
# row counts and buffers (auto_explain, no per-node timing), for every session opened after this.
if [[ -n ${SLOW_PLANS_MS:-} ]]; then
  psql -X -q "$DATABASE_URL" -c "LOAD 'auto_explain'" -c "ALTER SYSTEM SET session_preload_libraries = 'auto_explain'" \
    -c "ALTER SYSTEM SET auto_explain.log_min_duration = '${SLOW_PLANS_MS}ms'" -c "ALTER SYSTEM SET auto_explain.log_nested_statements = on" \
    -c "ALTER SYSTEM SET auto_explain.log_analyze = on" -c "ALTER SYSTEM SET auto_explain.log_timing = off" \
    -c "ALTER SYSTEM SET auto_explain.log_buffers = on" -c "SELECT pg_reload_conf()" >/dev/null
fi
children=()
workers=()
worker_ports=()
cleanup() {
  for pid in "${workers[@]}" "${children[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  # KEEP_LOGS=dir: the workers', receiver's, fake's and PostgreSQL's logs survive the run (a stall
  # to look into; with SLOW_PLANS_MS, the server log has the slow statements' plans).
  if [[ -n ${KEEP_LOGS:-} ]]; then
    mkdir -p "$KEEP_LOGS" && cp "$work"/*.log "$KEEP_LOGS"/ 2>/dev/null || true
    [[ -n ${PG_DIR:-} ]] && cp "$PG_DIR/server.log" "$KEEP_LOGS/postgres.log" 2>/dev/null || true
  fi
  pg_throwaway_stop
  rm -rf "$work"
}
trap cleanup EXIT
sql() { psql -X -q -At -v ON_ERROR_STOP=1 "$DATABASE_URL" "$@"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
now() { date +%s.%N; }
# CPU seconds (user + system) of a process; with `children`, also of its reaped children.
cpu_s() { awk -v hz="$(getconf CLK_TCK)" -v c="${2:-}" '{print ($14 + $15 + (c ? $16 + $17 : 0)) / hz}' "/proc/$1/stat" 2>/dev/null || echo 0; }
# CPU seconds PostgreSQL has used so far: the postmaster, its live children, and its exited ones
# (backends of closed connections, reaped by the postmaster).
pg_cpu_s() {
  local postmaster; postmaster=$(head -1 "$PG_DIR/data/postmaster.pid")
  # A closed connection's backend is counted once the postmaster has reaped it: wait for that
  # (back to the children PostgreSQL keeps: checkpointer, writers, launchers; and our psql's).
  for _ in $(seq 50); do (( $(pgrep -c -P "$postmaster") <= pg_children )) && break; sleep 0.05; done
  local total; total=$(cpu_s "$postmaster" children)
  for child in $(pgrep -P "$postmaster"); do total=$(python3 -c "print($total + $(cpu_s "$child"))"); done
  echo "$total"
}
"$migrate_bin" migrate --database-url "$DATABASE_URL" >/dev/null 2>&1
pg_children=$(pgrep -c -P "$(head -1 "$PG_DIR/data/postmaster.pid")")
# Statements are tracked only while profiling (ALTER SYSTEM: a command-line setting could not be changed).
sql -c "ALTER SYSTEM SET pg_stat_statements.track = 'none'" -c "SELECT pg_reload_conf()" >/dev/null
sql <<'SQL'
CREATE TABLE wal_warmup (n int);
DO $$ BEGIN
  FOR i IN 1..64 LOOP INSERT INTO wal_warmup VALUES (i); PERFORM pg_switch_wal(); END LOOP;
END $$;
DROP TABLE wal_warmup;
CHECKPOINT;
CHECKPOINT;
SQL
echo "==> PostgreSQL $("$PG_BIN/postgres" -V | awk '{print $3}') on 127.0.0.1:$PG_PORT (fsync on, synchronous_commit on), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"

# The fake Apple and the team key, for mix (d): workers sign client_secrets, the fake checks them.
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$work/AuthKey_BENCH.p8" 2>/dev/null
fake_port=$(free_port)
cache=${SIWA_BENCH_CACHE:-$HOME/.cache/siwa-bench-worker}
mkdir -p "$cache"
"$BIN/siwa" fake-apple --listen "127.0.0.1:$fake_port" --verify-key-file "$work/AuthKey_BENCH.p8" --team-id TEAMBENCH1 \
  --signing-key-file "$cache/apple-signing.pem" \
  >"$work/fake.log" 2>&1 &
children+=($!)
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$fake_port/auth/keys" >/dev/null 2>&1 && break; sleep 0.1; done
token_keys="k1:$(head -c32 /dev/urandom | base64)"

# --- queueing -------------------------------------------------------------------------------------
# Signed rows per shape (sign-held.py), loaded once into bench_held_<mix>; a siwa_receiver login
# (bench_receiver) stores them, so each job is held until a worker verifies it.
sql -c "SET client_min_messages = warning; CREATE ROLE bench_receiver LOGIN IN ROLE siwa_receiver"
receiver_url="postgresql://bench_receiver@127.0.0.1:$PG_PORT/postgres"
key_sum=$(sha256sum "$cache/apple-signing.pem" | cut -c1-12)
load_held() {  # load_held MIX COUNT
  local csv="$cache/held-$1-$2-$key_sum.csv"
  if [[ ! -s $csv ]]; then
    echo "==> signing $2 notifications of shape ($1) with the fake Apple's key (cached in $cache)"
    python3 "$here/sign-held.py" "$cache/apple-signing.pem" fake-1 "$1" "$2" "$csv"
  fi
  sql -c "CREATE TABLE bench_held_$1 (part int, jti text, client_id text, sub text, event_type text, event_ms bigint,
                                     email text, private text, claims text, jws text)" \
      -c "\\copy bench_held_$1 FROM '$csv' WITH (FORMAT csv)" -c "GRANT SELECT ON bench_held_$1 TO bench_receiver"
}
profile_runs=${PROFILE_RUNS:-a:1 c:1 c:2}
if [[ -n ${NO_PROFILE:-} ]]; then profile_runs=; fi
for shape in a $([[ " $MIXES " == *" b "* ]] && echo b) $([[ " $MIXES $profile_runs " == *" c"[\ :]* ]] && echo c); do
  load_held "$shape" "$N"
done
# store_held SHAPE [COUNT]: the receiver's INSERT (NotificationStore), one statement per part.
store_held() {
  local parts; parts=$(sql -c "SELECT DISTINCT part FROM bench_held_$1 ORDER BY 1")
  for part in $parts; do
    echo "INSERT INTO siwa.notifications (jti, client_id, sub, event_type, event_time, email, is_private_email, claims, jws)
          SELECT jti, client_id, sub, event_type, to_timestamp(event_ms::float8 / 1000), nullif(email, ''),
                 nullif(private, '')::boolean, claims::jsonb, jws
            FROM bench_held_$1 WHERE part = $part ORDER BY event_ms, jti LIMIT ${2:-$N};"
  done | psql -X -q -At -v ON_ERROR_STOP=1 "$receiver_url"
  local held; held=$(sql -c "SELECT count(*) FROM siwa.jobs WHERE kind = 'notification' AND run_at = 'infinity'")
  local stored; stored=$(sql -c "SELECT count(*) FROM siwa.notifications")
  [[ $held == "$stored" ]] || { echo "bench: only $held of $stored stored notifications are held" >&2; exit 1; }
}
reset() {  # every siwa table but the migration record, empty
  sql -c "SET client_min_messages = warning;
          DO \$\$ DECLARE t text; BEGIN
            SELECT string_agg(format('%I.%I', schemaname, tablename), ', ') INTO t FROM pg_tables
             WHERE schemaname = 'siwa' AND tablename <> 'schema_migrations';
            EXECUTE 'TRUNCATE ' || t || ' RESTART IDENTITY CASCADE';
          END \$\$;"
}
# notifications PREFIX SUB_EXPR COUNT [TYPE_EXPR] [TIME_EXPR]: one INSERT (the trigger queues the
# jobs in event_time order), with claims and a jws of the sizes Apple's tokens have.
notifications() {
  local type_expr=${4:-"(ARRAY['email-enabled','email-disabled','consent-revoked','account-deleted'])[1 + i % 4]"}
  local time_expr=${5:-"now() - interval '1 hour' + i * interval '1 ms'"}
  echo "INSERT INTO siwa.notifications (jti, client_id, sub, event_type, event_time, email, is_private_email, claims, jws)
        SELECT '$1' || i, 'com.example.app', $2, $type_expr, $time_expr, 'u' || i || '@privaterelay.appleid.com', true,
               jsonb_build_object('iss', 'https://appleid.apple.com', 'aud', 'com.example.app', 'iat', 1700000000,
                                  'exp', 1700086400, 'jti', '$1' || i, 'events', repeat('e', 180)),
               repeat(md5(i::text), 28)
          FROM generate_series(1, $3) AS i;"
}
linked_accounts() {  # linked_accounts SUB_PREFIX COUNT: active accounts linked before the signed events, with a token
  echo "INSERT INTO siwa.accounts (client_id, sub, app_user_id, status, email, is_private_email, refresh_token_enc, linked_at)
        SELECT 'com.example.app', '$1' || i, 'user-' || i, 'active', 'u' || i || '@privaterelay.appleid.com', true,
               decode(repeat('ab', 80), 'hex'), timestamptz '2025-12-01'
          FROM generate_series(1, $2) AS i;"
}
# links COUNT SUB_PREFIX: siwa.link_account calls, each with a fresh code from the fake Apple.
links() {
  python3 - "$fake_port" "$1" "$2" <<'PY'
import http.client, json, sys
port, count, prefix = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
for i in range(1, count + 1):
    connection.request("POST", "/fake/codes", json.dumps({"client_id": "com.example.app", "sub": f"{prefix}{i}"}),
                       {"Content-Type": "application/json"})
    code = json.loads(connection.getresponse().read())["code"]
    print(f"SELECT siwa.link_account('com.example.app', '{prefix}{i}', 'user-{i}', '{code}');")
PY
}
# queue MIX SIDE: fills the queue for one run (SIDE worker or raw: mix (d) needs real tokens and
# codes for the worker; the raw peer makes no HTTP calls, so placeholders serve).
queue() {
  reset
  case $1 in
    a) store_held a ;;
    b) sql -c "$(linked_accounts linked- "$N")"; store_held b ;;
    c) # 100 statements; statement k holds event p(k, account) of every account, p a permutation of
       # 0..99 per account, so each account's events arrive out of event_time order (sign-held.py).
       sql -c "$(linked_accounts hot- $((N / 100)))"; store_held c ;;
    d) if [[ $2 == worker ]]; then
         # Accounts to delete, linked through the fake Apple by a worker first, so that each holds a
         # real token for its revoke to send back to the fake.
         links "$APPLE_JOBS" del- | sql >/dev/null
         start_workers 1 apple
         wait_completed "$APPLE_JOBS" 120 "linking accounts for the revokes"
         stop_workers
         local linked; linked=$(sql -c "SELECT count(*) FROM siwa.accounts WHERE sub LIKE 'del-%' AND status = 'active'")
         [[ $linked == "$APPLE_JOBS" ]] || { echo "bench: only $linked of $APPLE_JOBS accounts linked" >&2; exit 1; }
         links "$APPLE_JOBS" link- | sql >/dev/null
       else
         sql -c "$(linked_accounts del- "$APPLE_JOBS")"
         sql -c "SELECT count(siwa.link_account('com.example.app', 'link-' || i, 'user-' || i, 'code-' || i))
                   FROM generate_series(1, $APPLE_JOBS) AS i" >/dev/null
       fi
       store_held a
       sql -c "SELECT count(siwa.request_deletion('com.example.app', 'del-' || i)) FROM generate_series(1, $APPLE_JOBS) AS i" >/dev/null
       ;;
  esac
  sql -c "ANALYZE" -c "CHECKPOINT"
}
# --- running --------------------------------------------------------------------------------------
start_workers() {  # start_workers COUNT [apple]
  for n in $(seq "$1"); do
    # The fake Apple serves the keys the held notifications are verified with, in every mix.
    local apple_env=(SIWA_APPLE_CALLS=disabled SIWA_APPLE_BASE_URL="http://127.0.0.1:$fake_port")
    [[ ${2:-} == apple ]] && apple_env=(SIWA_APPLE_BASE_URL="http://127.0.0.1:$fake_port" SIWA_TEAM_ID=TEAMBENCH1
      SIWA_KEY_ID=BENCH SIWA_PRIVATE_KEY_FILE="$work/AuthKey_BENCH.p8" SIWA_TOKEN_KEYS="$token_keys")
    local port; port=$(free_port)
    env DATABASE_URL="$DATABASE_URL" SIWA_CLIENT_IDS=com.example.app SIWA_LOG_LEVEL="${WORKER_LOG_LEVEL:-warn}" \
      SIWA_OPS_LISTEN="127.0.0.1:$port" "${apple_env[@]}" "${run_bin:-$worker_bin}" 2>>"$work/worker.log" &
    workers+=($!)
    worker_ports+=("$port")
  done
}
peak_rss_mb() {  # the largest VmHWM among the running workers
  local peak=0
  for pid in "${workers[@]}"; do
    local kb; kb=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
    (( kb > peak )) && peak=$kb
  done
  python3 -c "print(f'{$peak / 1024:.1f}')"
}
stop_workers() {
  for pid in "${workers[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${workers[@]}"; do wait "$pid" 2>/dev/null || true; done
  workers=()
  worker_ports=()
}
per_job_us() { python3 -c "print(round(1e6 * $1 / $2))"; }
# wait_completed COUNT SECONDS WHAT: until the running workers have completed COUNT jobs, read from
# their /metrics (polling PostgreSQL would add its own CPU to what the run is charged). One Python
# process polls over kept-alive connections: a curl and an awk per worker every 100 ms took 8 % of
# this machine's CPU from the workers being measured (perf, PERF=1), and the raw peer has no poller.
wait_completed() {
  python3 - "$1" "$2" "$3" "${worker_ports[@]}" <<'PY' || exit 1
import http.client, re, sys, time
target, seconds, what, ports = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4:]
deadline = time.monotonic() + seconds
connections = {}
def completed(port):
    for _ in range(2):  # a kept-alive connection the worker closed is opened once more
        try:
            connection = connections.get(port) or http.client.HTTPConnection("127.0.0.1", int(port), timeout=5)
            connections[port] = connection
            connection.request("GET", "/metrics")
            body = connection.getresponse().read().decode()
            return sum(float(m.group(1)) for m in re.finditer(r"^siwa_worker_jobs_completed_total(?:\{[^}]*\})? (\S+)$", body, re.M))
        except (OSError, http.client.HTTPException):
            connections.pop(port, None)
    return 0  # not listening yet
while True:
    done = sum(completed(port) for port in ports)
    if done >= target:
        sys.exit(0)
    if time.monotonic() > deadline:
        print(f"bench: {what} did not finish within {seconds:.0f} s ({done:.0f} of {target} jobs)", file=sys.stderr)
        sys.exit(1)
    time.sleep(0.1)
PY
}
wait_drained() {  # wait_drained SECONDS WHAT: until no job is waiting or running
  local deadline=$((SECONDS + $1))
  until [[ $(sql -c "SELECT count(*) FROM siwa.jobs WHERE state IN ('available', 'running')") == 0 ]]; do
    if (( SECONDS > deadline )); then
      # What was left, and what the workers said: a stall is a finding, not only a failed run.
      echo "bench: $2 did not finish within $1 s; jobs by kind and state: $(sql -F ' ' -c "SELECT kind, state, count(*)
              FROM siwa.jobs GROUP BY 1, 2 ORDER BY 1, 2" | tr '\n' ';')" >&2
      tail -5 "$work/worker.log" >&2
      # What PostgreSQL's sessions were doing meanwhile (a batch waiting on a lock, or on I/O).
      sql -F ' | ' -c "SELECT pid, application_name, state, wait_event_type || ':' || wait_event,
                              round(extract(epoch FROM now() - query_start)::numeric, 1) || ' s',
                              left(regexp_replace(query, '\s+', ' ', 'g'), 90)
                         FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
                        ORDER BY query_start" >"$work/sessions.log" 2>&1 || true
      echo "bench: PostgreSQL's sessions (pid | application | state | wait | running for | query):" >&2
      sed 's/^/  /' "$work/sessions.log" >&2
      # A statement running for seconds with no wait event is on CPU in its backend: where (its
      # stack, a few times), what the queue's table looks like (dead versions the claim index still
      # points at), and the held read's plan as it runs now.
      sql -F ' ' -c "SELECT 'siwa.jobs: live', n_live_tup, 'dead', n_dead_tup, 'autovacuums', autovacuum_count,
                            'last', coalesce(last_autovacuum::text, 'never')
                       FROM pg_stat_user_tables WHERE relid = 'siwa.jobs'::regclass" >&2 || true
      for busy in $(sql -c "SELECT pid FROM pg_stat_activity WHERE state = 'active' AND backend_type = 'client backend'
                               AND pid <> pg_backend_pid() AND now() - query_start > interval '2 seconds'"); do
        if command -v gdb >/dev/null; then
          for _ in 1 2 3; do
            timeout 30 gdb -p "$busy" -batch -ex "bt 25" 2>/dev/null | grep -E '^#' >>"$work/backend-$busy.stacks.log" || true
            echo "--" >>"$work/backend-$busy.stacks.log"; sleep 0.5
          done
          echo "bench: backend $busy's stacks (3 samples, backend-$busy.stacks.log):" >&2
          sed 's/^/  /' "$work/backend-$busy.stacks.log" | cut -c1-150 >&2
        fi
      done
      sql -c "BEGIN; SET LOCAL enable_seqscan = off; SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off;
              EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
              SELECT j.id FROM siwa.jobs j JOIN siwa.notifications n ON n.jti = j.notification_jti
               WHERE j.state = 'available' AND j.priority = 2 AND j.run_at >= 'infinity' AND j.kind = 'notification'
               ORDER BY j.priority, j.run_at, j.id LIMIT 250 FOR UPDATE OF j SKIP LOCKED; ROLLBACK" \
        >"$work/held-plan.log" 2>&1 || true
      echo "bench: the held read's plan now (held-plan.log):" >&2
      sed 's/^/  /' "$work/held-plan.log" >&2
      # Where each worker's threads are (gdb, when installed): a worker that claims nothing and
      # logs nothing is waiting somewhere, and this says where. Kept with KEEP_LOGS.
      if command -v gdb >/dev/null; then
        for pid in "${workers[@]}"; do
          timeout 60 gdb -p "$pid" -batch -ex "thread apply all bt 30" >"$work/worker-$pid.stacks.log" 2>&1 || true
          echo "bench: worker $pid's threads: $(grep -c '^Thread ' "$work/worker-$pid.stacks.log") (stacks in worker-$pid.stacks.log); frames of ours:" >&2
          grep -oE 'in \$s[0-9]+(WorkerCore|JobQueue|Postgres|Locking|AppleClient)[^ ]{0,80}' "$work/worker-$pid.stacks.log" \
            | sort | uniq -c | sort -rn | head -12 >&2
        done
      fi
      exit 1
    fi
    sleep 0.1
  done
}
# rates STARTED -> "notification_jobs/s apple_jobs/s all_jobs/s" from the jobs' finalized_at
rates() {
  sql -F ' ' -c "SELECT coalesce(round(count(*) FILTER (WHERE kind = 'notification')
                                / nullif(extract(epoch FROM max(finalized_at) FILTER (WHERE kind = 'notification')) - $1, 0)), 0),
                        coalesce(round(count(*) FILTER (WHERE kind <> 'notification')
                                / nullif(extract(epoch FROM max(finalized_at) FILTER (WHERE kind <> 'notification')) - $1, 0)), 0),
                        round(count(*) / (extract(epoch FROM max(finalized_at)) - $1))
                   FROM siwa.jobs WHERE state = 'completed' AND finalized_at > to_timestamp($1)"
}
check_books() {  # the worker's run: every notification job completed, every notification processed, no effect twice
  # (the revokes that ending events queue in mix (b) are Apple calls, left queued here: SIWA_APPLE_CALLS=disabled, so these workers claim none)
  local bad; bad=$(sql -c "SELECT (SELECT count(*) FROM siwa.notifications WHERE processed_at IS NULL)
                                + (SELECT count(*) FROM siwa.jobs WHERE state <> 'completed' AND kind = 'notification')
                                + (SELECT count(*) FROM (SELECT notification_jti FROM siwa.account_changes
                                    WHERE notification_jti IS NOT NULL GROUP BY 1 HAVING count(*) > 1) d)
                                + (SELECT count(*) FROM siwa.notifications WHERE outcome = 'forged')")
  [[ $bad == 0 ]] || { echo "bench: $bad notifications unprocessed, applied twice or refused as forged" >&2; exit 1; }
}
changes() { sql -c "SELECT count(*) FROM siwa.account_changes WHERE notification_jti IS NOT NULL"; }

# The run functions set `out` (no subshell: the workers they start must be theirs to stop).
run_worker() {  # run_worker MIX PROCESSES -> out=(notif/s apple/s all/s rss_mb changes pg_cpu_us/job worker_cpu_us/job deferred)
  queue "$1" worker >/dev/null
  local expected=$N; [[ $1 == d ]] && expected=$(( N + 2 * APPLE_JOBS ))
  local pg_before; pg_before=$(pg_cpu_s)
  local started; started=$(now)
  start_workers "$2" "$([[ $1 == d ]] && echo apple)"
  wait_completed "$expected" 300 "worker run ($1, $2 processes)"
  local rss; rss=$(peak_rss_mb)
  local deferred=0
  for port in "${worker_ports[@]}"; do
    deferred=$((deferred + $(curl -fs "http://127.0.0.1:$port/metrics" | awk '/^siwa_worker_notifications_deferred_total/ {s += $2} END {print s + 0}')))
  done
  local worker_cpu=0
  for pid in "${workers[@]}"; do worker_cpu=$(python3 -c "print($worker_cpu + $(cpu_s "$pid"))"); done
  stop_workers
  local pg_cpu; pg_cpu=$(python3 -c "print($(pg_cpu_s) - $pg_before)")
  check_books
  out=($(rates "$started") "$rss" "$(changes)" "$(per_job_us "$pg_cpu" "$expected")" "$(per_job_us "$worker_cpu" "$expected")" "$deferred")
}
run_raw() {  # run_raw MIX -> out=(notif/s apple/s all/s changes pg_cpu_us/job)
  queue "$1" raw >/dev/null
  local scripts=(-f "$here/raw-peer/notifications.sql")
  local transactions=$(( N / 50 ))
  case $1 in
    c) scripts=(-f "$here/raw-peer/hot.sql") ;;
    d) local weight=$(( 2 * APPLE_JOBS * 50 / N )); (( weight > 0 )) || weight=1
       scripts=(-f "$here/raw-peer/notifications.sql@1" -f "$here/raw-peer/apple.sql@$weight")
       transactions=$(( transactions + 2 * APPLE_JOBS )) ;;
  esac
  # Enough transactions per connection to drain the queue (pgbench picks weighted scripts at random);
  # the extra ones find nothing to claim and are not counted (rates use the jobs' finalized_at).
  local per=$(( transactions * 3 / 2 / RAW_CONNECTIONS + 10 ))
  local pg_before; pg_before=$(pg_cpu_s)
  local started; started=$(now)
  # -M prepared: the raw statements are planned once per connection, as a tuned client would.
  "$PG_BIN/pgbench" -n -M prepared -h 127.0.0.1 -p "$PG_PORT" -U postgres -c "$RAW_CONNECTIONS" -j "$RAW_CONNECTIONS" -t "$per" \
    "${scripts[@]}" postgres >"$work/pgbench.log" 2>&1 || { tail -5 "$work/pgbench.log" >&2; exit 1; }
  local pg_cpu; pg_cpu=$(python3 -c "print($(pg_cpu_s) - $pg_before)")
  # The revoke jobs (b)'s ending events queue stay queued, as the worker's do (its Apple calls are off).
  local left; left=$(sql -c "SELECT count(*) FROM siwa.jobs WHERE state IN ('available', 'running') AND kind <> 'revoke'")
  [[ $left == 0 ]] || echo "bench: the raw peer left $left jobs (rates count what it completed)" >&2
  local revokes; revokes=$(sql -c "SELECT (SELECT count(*) FROM siwa.jobs WHERE kind = 'revoke')
                                    - (SELECT count(*) FROM siwa.notifications n JOIN siwa.accounts a USING (client_id, sub)
                                        WHERE n.event_type IN ('consent-revoked', 'account-deleted') AND $([[ $1 == b ]] && echo true || echo false))")
  [[ $revokes == 0 || $1 == d ]] || echo "bench: the raw peer queued $revokes revoke jobs beside the ending events' tokens (0 expected)" >&2
  local expected=$N; [[ $1 == d ]] && expected=$(( N + 2 * APPLE_JOBS ))
  out=($(rates "$started") "$(changes)" "$(per_job_us "$pg_cpu" "$expected")")
}

# --- effect delay ---------------------------------------------------------------------------------
# A real siwa-receiver (a siwa_receiver login, so every job is held until the worker verifies it)
# gets RATE distinct signed notifications a second for WARMUP_SECONDS + RATE_SECONDS from
# steady-driver.py, on a fixed schedule; the first WARMUP_SECONDS are not measured (the worker's
# first held notification fetches Apple's keys, and its statements are planned once per
# connection: a steady state has neither, and 1 % of a 10 s run is a tenth of a second); the delay runs from the receiver's 200 (sent after its commit) to the commit of the
# effect (track_commit_timestamp of the change row), so it slightly understates the true
# commit-to-effect delay (by the 200's trip back, a fraction of a millisecond on loopback).
effect_delay() {  # -> out=(p50_ms p99_ms count sent rate late_p50_ms late_p99_ms answer_p50_ms answer_p99_ms non200 rss_mb fsync_ms)
  reset
  local total=$((RATE * (RATE_SECONDS + WARMUP_SECONDS)))
  "$BIN/siwa" simulate consent-revoked --client-id com.example.app --count "$total" --output "$work/steady.txt" \
    --fake-apple-url "http://127.0.0.1:$fake_port" --sub-prefix steady- 2>/dev/null
  local receiver_port; receiver_port=$(free_port)  # not `port`: wait_completed's loop sets that
  env DATABASE_URL="$receiver_url" SIWA_CLIENT_IDS=com.example.app SIWA_LISTEN="127.0.0.1:$receiver_port" \
    SIWA_APPLE_BASE_URL="http://127.0.0.1:$fake_port" SIWA_LOG_LEVEL=warn "$BIN/siwa-receiver" 2>>"$work/receiver.log" &
  local receiver=$!
  children+=("$receiver")
  for _ in $(seq 200); do curl -fs "http://127.0.0.1:$receiver_port/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
  curl -fs "http://127.0.0.1:$receiver_port/readyz" >/dev/null || { echo "bench: siwa-receiver not ready" >&2; tail -5 "$work/receiver.log" >&2; exit 1; }
  start_workers 1
  wait_completed 0 30 "worker start"
  sleep 1
  sql -c "ALTER SYSTEM SET track_wal_io_timing = on" -c "SELECT pg_reload_conf()" -c "SELECT pg_stat_reset_shared('wal')" >/dev/null
  if [[ -n ${DELAY_PROFILE:-} ]]; then  # the statements of the steady run, nested ones included
    sql -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" -c "ALTER SYSTEM SET pg_stat_statements.track = 'all'" \
        -c "SELECT pg_reload_conf()" -c "SELECT pg_stat_statements_reset()" >/dev/null 2>&1
  fi
  local driver; driver=$(python3 "$here/steady-driver.py" "http://127.0.0.1:$receiver_port/apple/notifications" "$work/steady.txt" \
    "$RATE" "$work/steady.tsv" 64)
  if [[ $(awk '{print $7}' <<<"$driver") != 0 ]]; then
    echo "bench: the receiver did not answer 200 to every notification (statuses: $(cut -f4 "$work/steady.tsv" | sort | uniq -c | tr '\n' ' '))" >&2
    tail -5 "$work/receiver.log" >&2
    exit 1
  fi
  wait_drained 60 "the steady-rate run"
  local rss; rss=$(peak_rss_mb)
  local fsync_ms; fsync_ms=$(sql -c "SELECT round((wal_sync_time / nullif(wal_sync, 0))::numeric, 2) FROM pg_stat_wal")
  sql -c "ALTER SYSTEM RESET track_wal_io_timing" -c "SELECT pg_reload_conf()" >/dev/null
  if [[ -n ${DELAY_PROFILE:-} ]]; then
    sql -F $'\t' -c "SELECT calls, round(total_exec_time::numeric, 1), round(mean_exec_time::numeric, 3),
                            left(regexp_replace(query, '\s+', ' ', 'g'), 80)
                       FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat_statements%'
                      ORDER BY total_exec_time DESC LIMIT 14" >"$work/delay-statements.txt"
    sql -c "ALTER SYSTEM SET pg_stat_statements.track = 'none'" -c "SELECT pg_reload_conf()" >/dev/null
  fi
  stop_workers
  kill -TERM "$receiver" 2>/dev/null || true
  wait "$receiver" 2>/dev/null || true
  local delay; delay=$(sql -F ' ' <<SQL
CREATE TEMP TABLE answered (jti text, due double precision, answered double precision, status int);
\\copy answered FROM '$work/steady.tsv'
DELETE FROM answered WHERE due < (SELECT min(due) FROM answered) + $WARMUP_SECONDS;
WITH d AS (SELECT extract(epoch FROM pg_xact_commit_timestamp(c.xmin)) - a.answered AS d
             FROM answered a JOIN siwa.account_changes c ON c.notification_jti = a.jti
            WHERE a.status = 200)
SELECT round((percentile_cont(0.5) WITHIN GROUP (ORDER BY d) * 1000)::numeric, 2),
       round((percentile_cont(0.99) WITHIN GROUP (ORDER BY d) * 1000)::numeric, 2), count(*)
  FROM d;
SQL
)
  # Where the delay goes: from the 200 to the start of the batch that applied it (waiting for a loop:
  # the doorbell, a batch in flight), and from there to its commit (verifying, effects, WAL flush);
  # how many jobs that batch took; and the seconds of the run with the worst p99.
  sql -F ' ' >"$work/delay-parts.txt" <<SQL
CREATE TEMP TABLE answered (jti text, due double precision, answered double precision, status int);
\\copy answered FROM '$work/steady.tsv'
DELETE FROM answered WHERE due < (SELECT min(due) FROM answered) + $WARMUP_SECONDS;
CREATE TEMP TABLE parts AS
SELECT a.due, extract(epoch FROM j.finalized_at) - a.answered AS waiting,
       extract(epoch FROM pg_xact_commit_timestamp(c.xmin) - j.finalized_at) AS batch,
       extract(epoch FROM pg_xact_commit_timestamp(c.xmin)) - a.answered AS delay,
       count(*) OVER (PARTITION BY c.xmin::text) AS jobs
  FROM answered a JOIN siwa.account_changes c ON c.notification_jti = a.jti JOIN siwa.jobs j ON j.id = c.job_id
 WHERE a.status = 200;
SELECT 'waiting for a batch (200 -> its start): p50 ' || round((percentile_cont(0.5) WITHIN GROUP (ORDER BY waiting) * 1000)::numeric, 2)
       || ' ms, p99 ' || round((percentile_cont(0.99) WITHIN GROUP (ORDER BY waiting) * 1000)::numeric, 2)
       || ' ms; the batch (start -> commit): p50 ' || round((percentile_cont(0.5) WITHIN GROUP (ORDER BY batch) * 1000)::numeric, 2)
       || ' ms, p99 ' || round((percentile_cont(0.99) WITHIN GROUP (ORDER BY batch) * 1000)::numeric, 2)
       || ' ms; jobs in it: p50 ' || percentile_disc(0.5) WITHIN GROUP (ORDER BY jobs)
       || ', p99 ' || percentile_disc(0.99) WITHIN GROUP (ORDER BY jobs) FROM parts;
SELECT 'worst seconds of the run (second: p99 ms, max ms): ' || string_agg(s || ': ' || p99 || ', ' || mx, '; ')
  FROM (SELECT s, round((percentile_cont(0.99) WITHIN GROUP (ORDER BY delay) * 1000)::numeric, 1) AS p99,
               round((max(delay) * 1000)::numeric, 1) AS mx
          FROM (SELECT floor(due - min(due) OVER ())::int AS s, delay FROM parts) x
         GROUP BY s ORDER BY p99 DESC LIMIT 3) w;
-- The clocks the delay is read from: the driver's (Python, the 200) and PostgreSQL's (the
-- receiver's insert, received_at). A delay every job shares while the insert is on time is the
-- worker; a shared offset here is the clock.
SELECT 'stored (200 -> the receiver''s insert): p50 ' || round((percentile_cont(0.5) WITHIN GROUP (ORDER BY d) * 1000)::numeric, 2)
       || ' ms, p99 ' || round((percentile_cont(0.99) WITHIN GROUP (ORDER BY d) * 1000)::numeric, 2) || ' ms'
  FROM (SELECT extract(epoch FROM n.received_at) - a.answered AS d
          FROM answered a JOIN siwa.notifications n ON n.jti = a.jti WHERE a.status = 200) x;
-- When the effects committed, by second since the first measured 200: a stall shows as empty
-- seconds followed by a burst; a worker that keeps pace but late shows the 200s' own shape, shifted.
SELECT 'effects committed per second since the first measured 200: ' || string_agg(s || ':' || n, ' ' ORDER BY s)
  FROM (SELECT floor(extract(epoch FROM pg_xact_commit_timestamp(c.xmin)) - (SELECT min(answered) FROM answered))::int AS s,
               count(*) AS n
          FROM answered a JOIN siwa.account_changes c ON c.notification_jti = a.jti GROUP BY 1) x;
SQL
  local forged; forged=$(sql -c "SELECT count(*) FROM siwa.notifications WHERE outcome = 'forged' OR processed_at IS NULL")
  [[ $forged == 0 ]] || { echo "bench: $forged steady notifications refused or left unprocessed" >&2; exit 1; }
  [[ $(wc -w <<<"$delay") == 3 ]] || { echo "bench: no effect delay measured ($delay; driver: $driver)" >&2; exit 1; }
  out=($delay $driver "$rss" "${fsync_ms:-0}")
}

# --- procrastinate --------------------------------------------------------------------------------
procrastinate_venv=${SIWA_BENCH_PROCRASTINATE_VENV:-$HOME/.cache/siwa-bench-procrastinate}
procrastinate_ready() {
  [[ -x "$procrastinate_venv/bin/procrastinate" ]] && return 0
  echo "bench: installing procrastinate into $procrastinate_venv (pip install procrastinate psycopg[binary])" >&2
  python3 -m venv "$procrastinate_venv" >"$work/pip.log" 2>&1 \
    && "$procrastinate_venv/bin/pip" install -q procrastinate 'psycopg[binary]' >>"$work/pip.log" 2>&1 \
    && [[ -x "$procrastinate_venv/bin/procrastinate" ]] && return 0
  echo "bench: procrastinate install from PyPI FAILED: $(tail -1 "$work/pip.log")" >&2
  return 1
}
peer_url="postgresql://postgres@127.0.0.1:$PG_PORT/peer"
procrastinate_setup() {
  sql -c "CREATE DATABASE peer"
  "$migrate_bin" migrate --database-url "$peer_url" >/dev/null 2>&1
  (cd "$here/procrastinate-peer" && PYTHONPATH=. PEER_DATABASE_URL=$peer_url "$procrastinate_venv/bin/procrastinate" \
    --app peer.app schema --apply >"$work/peer.log" 2>&1) || { cat "$work/peer.log" >&2; return 1; }
}
procrastinate_run() {  # procrastinate_run PROCESSES -> out=jobs/s
  local psql_peer=(psql -X -q -At -v ON_ERROR_STOP=1 "$peer_url")
  "${psql_peer[@]}" -c "SET client_min_messages = warning; TRUNCATE siwa.notifications, siwa.jobs, siwa.accounts,
                        siwa.account_changes; TRUNCATE procrastinate_jobs CASCADE"
  "${psql_peer[@]}" -c "$(notifications p "'peer-' || i" "$PEER_JOBS")"
  (cd "$here/procrastinate-peer" && PYTHONPATH=. PEER_DATABASE_URL=$peer_url "$procrastinate_venv/bin/python" -c "import peer; peer.defer($PEER_JOBS)") \
    >>"$work/peer.log" 2>&1 || { echo "bench: deferring procrastinate jobs failed" >&2; return 1; }
  "${psql_peer[@]}" -c "ANALYZE" -c "CHECKPOINT"
  local began; began=$(now)
  for _ in $(seq "$1"); do
    (cd "$here/procrastinate-peer" && exec env PYTHONPATH=. PEER_DATABASE_URL=$peer_url "$procrastinate_venv/bin/procrastinate" \
      --app peer.app --log-level warning worker --concurrency 4) >>"$work/peer.log" 2>&1 &
    workers+=($!)
  done
  local deadline=$((SECONDS + 180))
  until [[ $("${psql_peer[@]}" -c "SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'") == 0 ]]; do
    (( SECONDS > deadline )) && { echo "bench: procrastinate burn-down timed out" >&2; stop_workers; return 1; }
    sleep 0.1
  done
  local ended; ended=$(now)
  stop_workers
  out=$(python3 -c "print(round($PEER_JOBS / ($ended - $began)))")
}

# --- profile --------------------------------------------------------------------------------------
# Where a batch's time goes, on each mix of PROFILE_RUNS ("a:1 c:1 c:2": mix (a) with one worker
# process, mix (c) with one and with two): the workers' own histograms (a batch's round trip: claim,
# effects, completion and commit; the jobs left queued because their account was busy),
# pg_stat_statements with nested statements tracked (the plpgsql's statements one by one), and the
# WAL fsyncs (pg_stat_wal).
# PERF=1: also where the CPU went while the workers drained (perf, every process of the machine
# sampled): the share of each program, then the hottest functions of the worker and of PostgreSQL.
perf_summary() {  # perf_summary DATA (while the workers still run: their pids name their threads)
  command -v perf >/dev/null || { echo "  (PERF set, but perf is not installed)"; return; }
  local pids; pids=$(IFS=,; echo "${workers[*]}")
  echo "  CPU samples while draining (perf, whole machine, share of all samples): by program, then the hottest functions"
  local worker_share; worker_share=$(perf report -i "$1" --pid "$pids" --sort pid --stdio 2>/dev/null \
    | awk '/^ +[0-9.]+%/ {s += $1} END {printf "%.2f%%", s}' || true)
  echo "    $(printf '%7s' "$worker_share")  siwa-worker (every thread)"
  perf report -i "$1" --sort comm --stdio 2>/dev/null | grep -v -e 'qos' -e 'siwa-worker' \
    | awk '/^ +[0-9.]+%/ && $1+0 >= 1 {printf "    %7s  %s\n", $1, $2}' | head -6 || true
  for who in siwa-worker postgres; do
    echo "    $who:"
    if [[ $who == siwa-worker ]]; then set -- "$1" --pid "$pids"; else set -- "$1" --comm postgres; fi
    perf report -i "$@" --sort dso,sym --stdio 2>/dev/null \
      | awk '/^ +[0-9.]+%/ {pct=$1; $1=""; sub(/^ +/, ""); printf "      %7s  %s\n", pct, substr($0, 1, 110)}' | head -12 || true
    set -- "${@:1:1}"
  done
}

profile() {  # profile MIX PROCESSES
  sql -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" -c "ALTER SYSTEM SET pg_stat_statements.track = 'all'" \
      -c "ALTER SYSTEM SET track_wal_io_timing = on" -c "SELECT pg_reload_conf()" >/dev/null
  queue "$1" worker >/dev/null
  sql -c "SELECT pg_stat_statements_reset(), pg_stat_reset_shared('wal')" >/dev/null
  local started; started=$(now) perf_pid=
  if [[ -n ${PERF:-} ]]; then  # CPU samples of the whole machine while the workers drain the queue
    perf record -a -F 997 -o "$work/perf.data" >/dev/null 2>&1 & perf_pid=$!
  fi
  start_workers "$2"
  wait_completed "$N" 300 "the profiled run"
  if [[ -n $perf_pid ]]; then
    kill -INT "$perf_pid" 2>/dev/null; wait "$perf_pid" 2>/dev/null || true
    perf_summary "$work/perf.data"
  fi
  : >"$work/metrics.txt"
  for port in "${worker_ports[@]}"; do curl -fs "http://127.0.0.1:$port/metrics" >>"$work/metrics.txt" || true; done
  stop_workers
  local ended; ended=$(sql -c "SELECT extract(epoch FROM max(finalized_at)) FROM siwa.jobs")
  sql -F $'\t' -c "SELECT calls, round(total_exec_time::numeric, 1), round(mean_exec_time::numeric, 3), rows,
                          left(regexp_replace(query, '\s+', ' ', 'g'), 90)
                     FROM pg_stat_statements
                    WHERE query NOT LIKE '%pg_stat_statements%' AND query NOT LIKE 'SELECT count(*) FROM siwa.jobs WHERE state IN%'
                    ORDER BY total_exec_time DESC LIMIT 12" >"$work/statements.tsv"
  sql -F $'\t' -c "SELECT wal_records, wal_bytes, wal_sync, round(wal_sync_time::numeric, 1) FROM pg_stat_wal" >"$work/wal.tsv"
  sql -c "ALTER SYSTEM SET pg_stat_statements.track = 'none'" -c "ALTER SYSTEM RESET track_wal_io_timing" \
      -c "SELECT pg_reload_conf()" >/dev/null
  python3 - "$work/metrics.txt" "$work/statements.tsv" "$work/wal.tsv" "$started" "$ended" "$N" <<'PY'
import re, sys
metrics, statements, wal, started, ended, jobs = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
values = {}  # summed over the worker processes
for line in open(metrics):
    m = re.match(r'^(siwa_worker_notification_(?:batch_seconds|batch_jobs|verify_seconds)_(?:sum|count)|siwa_worker_notifications_deferred_total)(?:\{[^}]*\})? (\S+)$', line)
    if m: values[m.group(1)] = values.get(m.group(1), 0) + float(m.group(2))
wall = ended - started
batches = values.get("siwa_worker_notification_batch_seconds_count", 0)
batch_sum = values.get("siwa_worker_notification_batch_seconds_sum", 0)
if not batches:
    print("  (this siwa-worker build has no batch histograms: the worker's side is not shown)")
print(f"  {jobs} jobs in {wall:.2f} s ({jobs / wall:,.0f} jobs/s): {batches:.0f} batches, "
      f"{values.get('siwa_worker_notification_batch_jobs_sum', 0) / max(batches, 1):.0f} jobs each; "
      f"{values.get('siwa_worker_notifications_deferred_total', 0):.0f} jobs left queued (account busy)")
print(f"  a batch as the worker sees it (round trip, commit included): mean {1000 * batch_sum / max(batches, 1):.2f} ms; "
      f"batches in flight on average {batch_sum / wall:.2f}")
rows = [line.rstrip("\n").split("\t") for line in open(statements) if line.strip()]
top = next((r for r in rows if "run_notification_batch" in r[4] and r[4].lstrip().upper().startswith("SELECT JOB_ID")), None)
verify_sum = values.get("siwa_worker_notification_verify_seconds_sum", 0)
print(f"  verifying the held notifications in the worker (RS256 and columns; inside the batch's transaction): "
      f"mean {1000 * verify_sum / max(batches, 1):.2f} ms a batch, {1e6 * verify_sum / max(jobs, 1):.0f} us a job")
if top:
    top_ms = float(top[1])
    print(f"  inside PostgreSQL, siwa.run_notification_batch: mean {float(top[2]):.2f} ms a batch; the rest of the round trip "
          f"(verifying, BEGIN and COMMIT, network, the worker) {1000 * batch_sum / max(batches, 1) - float(top[2]):.2f} ms")
sync = [line.rstrip("\n").split("\t") for line in open(wal) if line.strip()][0]
print(f"  WAL: {int(sync[0]):,} records, {int(sync[1]) / 1e6:.1f} MB, {sync[2]} fsyncs, {float(sync[3]):.0f} ms in fsync "
      f"({float(sync[3]) / max(int(sync[2]), 1):.2f} ms each)")
print(f"  {'calls':>7} {'total ms':>9} {'mean ms':>8} {'share':>6}  statement (nested ones included)")
for calls, total, mean, _, query in rows:
    share = f"{float(total) / top_ms:6.1%}" if top else ""
    print(f"  {calls:>7} {float(total):>9.1f} {float(mean):>8.3f} {share}  {query}")
PY
}

# --- the runs -------------------------------------------------------------------------------------
declare -A result mix_name
mix_name=([a]="(a) unseen subs" [b]="(b) linked accounts" [c]="(c) hot accounts, out of order" [d]="(d) with exchanges and revokes")
echo "==> every notification stored by a siwa_receiver login, so held; each worker verifies its jws (RS256, the fake Apple's key) and columns before applying it (StoredNotificationGate); the raw peer reads the same held rows with their jws but does no RSA"
echo "==> $N notification jobs a run$( [[ " $MIXES " == *" d "* ]] && echo ", plus $APPLE_JOBS exchanges and $APPLE_JOBS revokes in (d)"); worker settings: $(env | grep '^SIWA_' | tr '\n' ' ')"
# Warm-up, not reported: the first run on a fresh cluster pays for cold caches.
saved_n=$N; N=$((N / 4)); run_worker a 1; N=$saved_n
for round in $(seq "$REPEAT"); do
  for mix in $MIXES; do
    echo "--- ${mix_name[$mix]}, round $round (load $(cut -d' ' -f1 /proc/loadavg))"
    run_raw "$mix"; read -r r1n r1a r1all r1changes r1cpu <<<"${out[*]}"
    echo "    raw SQL, $RAW_CONNECTIONS connections:  $r1all jobs/s (notifications $r1n/s, Apple kinds $r1a/s), $r1changes changes;" \
         "CPU per job: PostgreSQL $r1cpu us"
    run_worker "$mix" 1; read -r w1n w1a w1all w1rss w1changes w1cpu w1wcpu w1def <<<"${out[*]}"
    echo "    1 worker process:        $w1all jobs/s (notifications $w1n/s, Apple kinds $w1a/s), $w1changes changes;" \
         "CPU per job: PostgreSQL $w1cpu us, worker $w1wcpu us; RSS $w1rss MB; $w1def jobs deferred (account busy)"
    run_worker "$mix" 2; read -r w2n w2a w2all w2rss w2changes w2cpu w2wcpu w2def <<<"${out[*]}"
    echo "    2 worker processes:      $w2all jobs/s (notifications $w2n/s, Apple kinds $w2a/s), $w2changes changes;" \
         "CPU per job: PostgreSQL $w2cpu us, worker $w2wcpu us; RSS $w2rss MB; $w2def jobs deferred (account busy)"
    c1all=0; c2all=0
    if [[ -n $compare_bin ]]; then
      run_bin=$compare_bin
      run_worker "$mix" 1; read -r c1n c1a c1all c1rss c1changes c1cpu c1wcpu c1def <<<"${out[*]}"
      echo "    1 process, COMPARE_BIN:  $c1all jobs/s (notifications $c1n/s, Apple kinds $c1a/s), $c1changes changes;" \
           "CPU per job: PostgreSQL $c1cpu us, worker $c1wcpu us; RSS $c1rss MB; $c1def jobs deferred (account busy)"
      run_worker "$mix" 2; read -r c2n c2a c2all c2rss c2changes c2cpu c2wcpu c2def <<<"${out[*]}"
      echo "    2 processes, COMPARE_BIN: $c2all jobs/s (notifications $c2n/s, Apple kinds $c2a/s), $c2changes changes;" \
           "CPU per job: PostgreSQL $c2cpu us, worker $c2wcpu us; RSS $c2rss MB; $c2def jobs deferred (account busy)"
      run_bin=
    fi
    run_raw "$mix"; read -r r2n r2a r2all r2changes r2cpu <<<"${out[*]}"
    echo "    raw SQL, $RAW_CONNECTIONS connections:  $r2all jobs/s (notifications $r2n/s, Apple kinds $r2a/s), $r2changes changes;" \
         "CPU per job: PostgreSQL $r2cpu us"
    result[$mix]+="$w1all $w2all $r1all $r2all $w1rss $w2rss $c1all $c2all;"
  done
done
for run in $profile_runs; do
  echo "--- profile: mix ${mix_name[${run%:*}]}, ${run#*:} worker process(es) (load $(cut -d' ' -f1 /proc/loadavg))"
  profile "${run%:*}" "${run#*:}"
done
p50=0 p99=0 delay_count=0 sent=0 achieved=0 late50=0 late99=0 answer50=0 answer99=0 non200=0 delay_rss=0 fsync_ms=0
if [[ -z ${NO_DELAY:-} ]]; then
effect_delay; read -r p50 p99 delay_count sent achieved late50 late99 answer50 answer99 non200 delay_rss fsync_ms <<<"${out[*]}"
echo "--- steady $RATE notifications/s for ${RATE_SECONDS} s (after ${WARMUP_SECONDS} s not measured) through siwa-receiver (held -> verified -> applied), 1 worker process:"
echo "    achieved $achieved/s ($sent sent, $non200 not answered 200; sent late by p50 $late50 ms, p99 $late99 ms); the receiver's answer p50 $answer50 ms, p99 $answer99 ms"
echo "    effect delay (the receiver's 200 -> the effect's commit, $delay_count effects): p50 $p50 ms, p99 $p99 ms; RSS $delay_rss MB"
echo "    a WAL fsync took $fsync_ms ms on average meanwhile (every effect waits for one: its own commit's)"
sed 's/^/    /' "$work/delay-parts.txt"
[[ -s $work/delay-statements.txt ]] && { echo "    statements of the steady run (calls, total ms, mean ms):"; sed 's/^/      /' "$work/delay-statements.txt"; }
fi
peer1=0; peer2=0
if [[ -z ${NO_PEER:-} ]] && procrastinate_ready && procrastinate_setup; then
  procrastinate_run 1 && peer1=$out
  echo "--- procrastinate peer, 1 process ($PEER_JOBS jobs, the same writes per job): $peer1 jobs/s"
  procrastinate_run 2 && peer2=$out
  echo "--- procrastinate peer, 2 processes: $peer2 jobs/s"
else
  echo "--- procrastinate peer NOT RUN${NO_PEER:+ (NO_PEER set)}"
fi

echo
python3 - "$peer1" "$peer2" "$p50" "$p99" "$delay_rss" "$RAW_CONNECTIONS" "$achieved" "$RATE" "$(for m in $MIXES; do echo "$m=${result[$m]}"; done)" <<'PY'
import statistics, sys
peer1, peer2, p50, p99, delay_rss = (float(x) for x in sys.argv[1:6])
raw_connections, achieved, rate = sys.argv[6], float(sys.argv[7]), float(sys.argv[8])
names = {"a": "(a) unseen", "b": "(b) linked", "c": "(c) hot", "d": "(d) + Apple jobs"}
def row(name, value, target, ok):
    verdict = "" if ok is None else ("ok" if ok else "BELOW TARGET")
    print(f"  {name:<40} {value:>14}   {target:<26} {verdict}")
print(f"  {'figure':<40} {'value':>14}   {'target':<26}")
rss = [delay_rss]
one_rates = []; two_rates = []
for line in sys.argv[9].splitlines():
    mix, runs = line.split("=", 1)
    runs = [[float(x) for x in r.split()] for r in runs.split(";") if r]
    # Ratios per round (both sides in the same round), then their median over the rounds.
    r1 = statistics.median(w1 / ((ra + rb) / 2) for w1, w2, ra, rb, *_ in runs)
    r2 = statistics.median(w2 / ((ra + rb) / 2) for w1, w2, ra, rb, *_ in runs)
    w1 = statistics.median(r[0] for r in runs); w2 = statistics.median(r[1] for r in runs)
    raw = statistics.median((r[2] + r[3]) / 2 for r in runs)
    rss += [r[4] for r in runs] + [r[5] for r in runs]
    targeted = mix in "abc"
    row(f"{names[mix]}: raw SQL, {raw_connections} connections", f"{raw:,.0f} jobs/s", "(peer)", None)
    row(f"{names[mix]}: 1 worker process", f"{w1:,.0f} jobs/s {r1:4.0%}", ">= 40% of raw" if targeted else "(no target)", r1 >= 0.40 if targeted else None)
    row(f"{names[mix]}: 2 worker processes", f"{w2:,.0f} jobs/s {r2:4.0%}", ">= 50% of raw" if targeted else "(no target)", r2 >= 0.50 if targeted else None)
    if any(r[6] for r in runs):
        for column, label in ((6, "1 process"), (7, "2 processes")):
            ratio = statistics.median(r[column] / ((r[2] + r[3]) / 2) for r in runs)
            value = statistics.median(r[column] for r in runs)
            row(f"{names[mix]}: {label}, COMPARE_BIN", f"{value:,.0f} jobs/s {ratio:4.0%}", "(the build compared)", None)
    if mix == "a": one_rates.append(w1); two_rates.append(w2)
if peer1 > 0 and peer2 > 0 and one_rates:
    row("(a) 1 worker / procrastinate 1 process", f"{one_rates[0] / peer1:.1f}x", ">= 20x", one_rates[0] >= 20 * peer1)
    row("(a) 2 workers / procrastinate 2 processes", f"{two_rates[0] / peer2:.1f}x", ">= 20x", two_rates[0] >= 20 * peer2)
else:
    print("  procrastinate ratios: NOT MEASURED (the peer did not run, or mix (a) was not run)")
row("steady rate achieved (the delay is judged at it)", f"{achieved:,.0f}/s", f">= 97% of {rate:,.0f}/s", achieved >= 0.97 * rate)
row("effect delay p50 at steady rate", f"{p50:.2f} ms", "<= 5 ms", p50 <= 5)
row("effect delay p99 at steady rate", f"{p99:.2f} ms", "<= 20 ms", p99 <= 20)
row("worker RSS, peak of any process", f"{max(rss):.1f} MB", "<= 64 MB", max(rss) <= 64)
PY
