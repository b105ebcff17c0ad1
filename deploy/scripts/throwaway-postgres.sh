# Sourced by benchmarks and checks: starts a throwaway PostgreSQL cluster on 127.0.0.1.
#   source deploy/scripts/throwaway-postgres.sh
#   pg_throwaway_start [extra postgres -c settings...]   # sets PG_BIN PG_DIR PG_PORT DATABASE_URL
#   pg_throwaway_stop                                    # also run on EXIT
# As root the server runs as the `postgres` user (initdb and postgres refuse root).

pg_throwaway_find_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }

pg_throwaway_start() {
  PG_BIN=${PG_BIN:-$(pg_throwaway_find_bin)}
  [[ -x "$PG_BIN/initdb" ]] || { echo "PostgreSQL server binaries not found: apt-get install -y postgresql" >&2; return 1; }
  PG_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  PG_DIR=$(mktemp -d /tmp/siwa-bench-pg.XXXXXX)
  chmod 755 "$PG_DIR"
  PG_AS=()
  if [[ $(id -u) -eq 0 ]]; then chown postgres "$PG_DIR"; PG_AS=(runuser -u postgres --); fi
  "${PG_AS[@]}" "$PG_BIN/initdb" -D "$PG_DIR/data" -A trust -U postgres -E UTF8 >"$PG_DIR/initdb.log" 2>&1 \
    || { cat "$PG_DIR/initdb.log" >&2; return 1; }
  local settings=(-c listen_addresses=127.0.0.1 -c "port=$PG_PORT" -c "unix_socket_directories=$PG_DIR"
                  -c max_connections=300 -c shared_buffers=256MB)
  for extra in "$@"; do settings+=(-c "$extra"); done
  "${PG_AS[@]}" "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -w -t 60 -l "$PG_DIR/server.log" -o "${settings[*]}" start >/dev/null \
    || { cat "$PG_DIR/server.log" >&2; return 1; }
  DATABASE_URL="postgresql://postgres@127.0.0.1:$PG_PORT/postgres"
  export PG_BIN PG_DIR PG_PORT DATABASE_URL
  trap pg_throwaway_stop EXIT
}

pg_throwaway_stop() {
  [[ -n "${PG_DIR:-}" && -d "$PG_DIR" ]] || return 0
  "${PG_AS[@]}" "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m fast -w -t 30 stop >/dev/null 2>&1
  rm -rf "$PG_DIR"
  PG_DIR=
}
