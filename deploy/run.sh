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
swift build -c "$configuration" --product siwa
swift build -c "$configuration" --product siwa-receiver
swift build -c "$configuration" --product siwa-worker

bin="$(swift build -c "$configuration" --show-bin-path)"
echo "==> starting: $bin/siwa dev $*"
exec "$bin/siwa" dev "$@"
