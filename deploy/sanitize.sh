#!/usr/bin/env bash
# Runs the whole suite (unit + integration) under ThreadSanitizer, then AddressSanitizer, each in
# its own build folder (.build/tsan, .build/asan) so the normal build stays as it is, in the two
# passes deploy/test.sh runs (deploy/scripts/test-passes.sh). Prints the time of each build and
# run. Too slow for CI on 2 cores (see Tests/README.md, "Proof under stress"): run it by hand or
# nightly.   deploy/sanitize.sh [thread|address ...]   (default: both)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/opt/swift/usr/bin"
# Chromium for ConsoleBrowserTests, as deploy/test.sh.
deploy/scripts/install-deps.sh chromium >/dev/null
source deploy/scripts/test-passes.sh

# The sanitizers run everything several times slower: the tests' fixed bounds on a client's wait
# scale by SIWA_TEST_TIME_SCALE (Tests/TestTiming/TestTimeScale.swift): 8 under ThreadSanitizer
# (at 4, HTTP clients' 30 s bounds ran out), 4 under AddressSanitizer. The
# model-based tests try fewer random cases (their fixed regression cases and, for each case, every
# order they enumerate still run). Each may be set by the caller.
time_scale() { if [ "$1" = thread ]; then echo "${SIWA_TEST_TIME_SCALE:-8}"; else echo "${SIWA_TEST_TIME_SCALE:-4}"; fi; }
export SIWA_MODEL_SEQUENCES="${SIWA_MODEL_SEQUENCES:-150}"
export SIWA_CONCURRENCY_TRIALS="${SIWA_CONCURRENCY_TRIALS:-60}"
export SIWA_FEED_MODEL_SEQUENCES="${SIWA_FEED_MODEL_SEQUENCES:-40}"

status=0
for sanitizer in "${@:-thread address}"; do
  for s in $sanitizer; do
    scratch=".build/${s:0:1}san"
    log="/tmp/siwa-sanitize-$s.log"
    echo "==> swift build --build-tests --sanitize=$s"
    started=$(date +%s)
    if ! swift build --build-tests --scratch-path "$scratch" --sanitize="$s" >"$log" 2>&1; then
      grep -E "error" "$log" | sort -u | head -20
      echo "    $s: build FAILED in $(( $(date +%s) - started )) s (log: $log)"
      status=1
      continue
    fi
    echo "    built in $(( $(date +%s) - started )) s"
    echo "==> swift test --sanitize=$s (SIWA_TEST_TIME_SCALE=$(time_scale "$s"))"
    started=$(date +%s)
    # Reports from the test process and from every child (receiver, worker: ServiceProcess passes
    # the options through) go to one folder. TSan: every race, not only the first.
    reports_dir="/tmp/siwa-sanitize-$s"
    rm -rf "$reports_dir" && mkdir -p "$reports_dir"
    if SIWA_TEST_TIME_SCALE=$(time_scale "$s") TSAN_OPTIONS="halt_on_error=0 second_deadlock_stack=1 log_path=$reports_dir/report" \
        ASAN_OPTIONS="detect_leaks=0 log_path=$reports_dir/report" \
        run_test_passes --skip-build --scratch-path "$scratch" --sanitize="$s" --disable-xctest >>"$log" 2>&1; then
      result=passed
    else
      result=FAILED
      status=1
    fi
    reports=$(cat "$reports_dir"/report* 2>/dev/null | grep -c -E "WARNING: ThreadSanitizer|ERROR: AddressSanitizer" || true)
    # Our locks are pthread mutexes (Locking.Locked), which ThreadSanitizer sees, so any report
    # is taken seriously: listed by function, and the run fails.
    if [ "$reports" -gt 0 ]; then
      cat "$reports_dir"/report* | grep -A3 -E "WARNING: ThreadSanitizer|ERROR: AddressSanitizer" | grep "#0 " \
        | sed -E 's/ \(.*//; s/^ *#0 //' | sort | uniq -c
      status=1
    fi
    # One summary line per pass.
    tests=$(grep -o -E "Test run with [0-9]+ tests?.*" "$log" | paste -sd ';' - || true)
    echo "    $s: $result in $(( $(date +%s) - started )) s (${tests:-no test summary}), $reports sanitizer reports in $reports_dir (log: $log)"
  done
done
exit "$status"
