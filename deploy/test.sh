#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs the whole suite. The integration
# tests start their own throwaway PostgreSQL (set TEST_DATABASE_URL to use an existing one).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/opt/swift/usr/bin"

# Chromium only for the tests: the console's pages are loaded in a real headless browser
# (ConsoleBrowserTests); deploy/run.sh never needs it.
deploy/scripts/install-deps.sh chromium

echo "==> building"
# STYLE.md §8's checks: warnings fail the build (they are how Swift 6 reports most concurrency
# mistakes), every Sendable conformance is explicit, and a module may only import what its target
# declares.
# The log is this run's own (two runs at once, or another user's file, never mix).
build_log=$(mktemp "${TMPDIR:-/tmp}/siwa-build.XXXXXX")
trap 'rm -f "$build_log"' EXIT
if ! swift build --build-tests -Xswiftc -warnings-as-errors -Xswiftc -require-explicit-sendable \
    --explicit-target-dependency-import-check error >"$build_log" 2>&1; then
  grep -E "error|warning" "$build_log" | sort -u | head -50
  tail -20 "$build_log"
  exit 1
fi

echo "==> testing"
# Fixed bounds on waits (for hangs, never speed) scale by this on a machine this small: two cores run
# every suite's PostgreSQL, workers and fake Apples at once. deploy/sanitize.sh sets 8 (thread), 4 (address).
export SIWA_TEST_TIME_SCALE=${SIWA_TEST_TIME_SCALE:-2}
# The lifecycle model's run seed comes from the commit, so a commit always gets the same verdict and
# a failure replays from this line (set SIWA_MODEL_SEED to choose another; fresh seeds are
# deploy/check/lifecycle-explore.sh's job).
if [ -z "${SIWA_MODEL_SEED:-}" ] && commit=$(git rev-parse --verify -q HEAD 2>/dev/null); then
  export SIWA_MODEL_SEED=0x${commit:0:16}
fi
echo "==> lifecycle model seed ${SIWA_MODEL_SEED:-random (not a git checkout)}"
if [ $# -gt 0 ]; then
  swift test --skip-build --disable-xctest "$@"
else
  # Two passes (deploy/scripts/test-passes.sh says which suites and why).
  source deploy/scripts/test-passes.sh
  run_test_passes --skip-build --disable-xctest
fi

# The deployment files and the database roles, checked for real (they print "N passed, N failed").
# Skipped when the call narrows the Swift tests (arguments given).
check() {  # check NAME SCRIPT: run it, show its summary line, or everything when it fails
  local log status=0
  log=$(mktemp)
  echo "==> checking $1 ($2)"
  if bash "$2" >"$log" 2>&1; then tail -1 "$log"; else cat "$log"; status=1; fi
  rm -f "$log"
  return $status
}
if [ $# -eq 0 ]; then
  check "the package's dependency lists" deploy/check/package-deps.sh
  check "which module names which table" deploy/check/ownership-check.sh
  check "the modules' layers" deploy/check/layers-check.sh
  check "the database roles" deploy/check/roles-check.sh
  check "the deployment files" deploy/check/deploy-check.sh
  check "the runtime image's packages against the binaries' libraries" deploy/check/runtime-libs.sh
  check "the app API against its OpenAPI document" deploy/check/app-api-fuzz.sh
fi
