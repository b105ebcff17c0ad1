#!/usr/bin/env bash
# Runs the whole stack on this machine: installs the Debian packages that are missing, builds, and
# starts `siwa dev` (throwaway PostgreSQL, fake Apple, siwa-receiver, one siwa-worker). Ctrl-C stops
# everything and deletes the throwaway database.
#
#   ./deploy/run.sh                    # everything local
#   ./deploy/run.sh --once             # start, wait until ready, stop (a smoke test)
#   DATABASE_URL=postgresql://... ./deploy/run.sh    # use an existing database instead
#
# Any further arguments go to `siwa dev` (see `siwa help`). Set SIWA_BUILD=release for an optimised build.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/opt/swift/usr/bin"

deploy/scripts/install-deps.sh

configuration="${SIWA_BUILD:-debug}"
echo "==> building ($configuration)"
# One build of every product, with the same plan each time: on an unchanged tree it does nothing
# (about 1.5 s). Building the products one by one (--product X) made each run relink the SQL
# embedding tool and re-embed sql/ (about 6 s), and --show-bin-path is one more invocation.
started=$SECONDS
swift build -c "$configuration"
# After the build that first makes the SQL embedding tool, SwiftPM relinks that tool once more on
# the next build (measured: the second run of a fresh clone took 4.6 s, the third 0.5 s). Taking
# that pass here, quietly, costs about half a second when there is nothing to do, and the next run
# then goes straight to the stack.
swift build -c "$configuration" --quiet
echo "==> built in $((SECONDS - started)) s"

bin="$PWD/.build/$configuration"
echo "==> starting: $bin/siwa dev $*"
# siwa dev's banner begins its paste block with `export PATH="$bin:$PATH"`, so `siwa status` and
# the other commands can be typed as they are in another terminal.
exec "$bin/siwa" dev "$@"
