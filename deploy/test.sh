#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs the whole suite. The integration
# tests start their own throwaway PostgreSQL (set TEST_DATABASE_URL to use an existing one).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/opt/swift/usr/bin"

deploy/scripts/install-deps.sh

echo "==> building"
# STYLE.md §8's checks: warnings fail the build (they are how Swift 6 reports most concurrency
# mistakes), every Sendable conformance is explicit, and a module may only import what its target
# declares.
if ! swift build --build-tests -Xswiftc -warnings-as-errors -Xswiftc -require-explicit-sendable \
    --explicit-target-dependency-import-check error >/tmp/siwa-build.log 2>&1; then
  grep -E "error|warning" /tmp/siwa-build.log | sort -u | head -50
  tail -20 /tmp/siwa-build.log
  exit 1
fi

echo "==> testing"
swift test --skip-build --disable-xctest "$@"

# The deployment files and the database roles, checked for real (they print "N passed, N failed").
# Skipped when the call narrows the Swift tests (arguments given).
check() {  # check NAME SCRIPT: run it, show its summary line, or everything when it fails
  local log
  log=$(mktemp)
  echo "==> checking $1 ($2)"
  if bash "$2" >"$log" 2>&1; then tail -1 "$log"; else cat "$log"; return 1; fi
}
if [ $# -eq 0 ]; then
  check "the database roles" deploy/check/roles-check.sh
  check "the deployment files" deploy/check/deploy-check.sh
fi
