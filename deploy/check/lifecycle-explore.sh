#!/usr/bin/env bash
# Explores the account lifecycle model on fresh seeds, for as long as you leave it running:
# LifecycleModelTests.everyInterleavingEndsRight, run after run, each with a new random run seed
# (SIWA_MODEL_SEED) of PER_RUN sequences, until TOTAL sequences have run. Each run's verdict is
# printed as it ends; a failing run's report (the defect, its replay seed, the shrunk sequence) is
# kept in the log folder. The last line is the summary: sequences, runs, failures, seeds, time.
#
# Usage: deploy/check/lifecycle-explore.sh [TOTAL=10000] [PER_RUN=1000]
# Environment: SIWA_MODEL_LANES (default 3), KEEP_LOGS=DIR (default a temp folder, printed).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PATH:/opt/swift/usr/bin"
total=${1:-10000}
per_run=${2:-1000}
logs=${KEEP_LOGS:-$(mktemp -d "${TMPDIR:-/tmp}/siwa-explore.XXXXXX")}
mkdir -p "$logs"

echo "==> building the tests"
# The flags of deploy/test.sh: other flags would rebuild every module, here and at the next test run.
swift build --build-tests -Xswiftc -warnings-as-errors -Xswiftc -require-explicit-sendable \
  --explicit-target-dependency-import-check error >"$logs/build.log" 2>&1 || { tail -20 "$logs/build.log"; exit 1; }

started=$(date +%s)
done_sequences=0 runs=0 failed_runs=0 seeds=()
echo "==> exploring $total sequences, $per_run a run; logs in $logs"
while [ "$done_sequences" -lt "$total" ]; do
  seed=$(printf '0x%016x' "$(( (RANDOM << 48) ^ (RANDOM << 32) ^ (RANDOM << 16) ^ RANDOM ))")
  count=$(( total - done_sequences < per_run ? total - done_sequences : per_run ))
  log="$logs/run-$seed.log"
  SIWA_MODEL_SEED=$seed SIWA_MODEL_SEQUENCES=$count SIWA_TEST_TIME_SCALE=${SIWA_TEST_TIME_SCALE:-2} \
    swift test --skip-build --disable-xctest --filter 'LifecycleModelTests/everyInterleavingEndsRight' >"$log" 2>&1
  status=$?
  runs=$((runs + 1)) done_sequences=$((done_sequences + count)) seeds+=("$seed")
  elapsed=$(( $(date +%s) - started ))
  if [ "$status" -eq 0 ]; then
    verdict="clean"
    rm -f "$log"
  else
    failed_runs=$((failed_runs + 1))
    verdict="FAILED: $(grep -m1 -E '^DEFECT|lifecycle model: [0-9]+ distinct' "$log" || echo "see $log"); report $log"
  fi
  echo "run $runs seed $seed: $count sequences $verdict ($done_sequences of $total, ${elapsed}s)"
done
elapsed=$(( $(date +%s) - started ))
echo "lifecycle explore: $done_sequences sequences in $runs runs, $failed_runs failed, ${elapsed}s; seeds ${seeds[*]}"
[ "$failed_runs" -eq 0 ]
