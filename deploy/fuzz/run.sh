#!/usr/bin/env bash
# Fuzzes the receiver's whole decoding path (body bytes → payload → compact JWS → alg pin → key →
# signature → claims → AppleNotification) with libFuzzer and AddressSanitizer, for a bounded time.
#
#   deploy/fuzz/run.sh [seconds=60]
#
# Builds Fuzz/SiwaFuzz (and everything it uses) instrumented, in its own scratch folder
# (.build/fuzz), then runs it over a copy of the seed corpus (deploy/fuzz/corpus, made by
# `SiwaFuzz make-corpus Tests/Fixtures/notification-claims.json deploy/fuzz/corpus`). New inputs
# land in .build/fuzz/corpus; a crash leaves crash-* in .build/fuzz/artifacts and exits non-zero:
# turn it into a unit test in Tests/ReceiverCoreTests.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PATH:/opt/swift/usr/bin"
seconds="${1:-60}"

deploy/scripts/install-deps.sh >/dev/null

echo "==> building SiwaFuzz with -sanitize=fuzzer,address"
started=$(date +%s)
# lld: gold fails on the instrumented objects (internal error in dwarf_reader).
if ! swift build --scratch-path .build/fuzz --product SiwaFuzz \
    -Xswiftc -sanitize=fuzzer,address -Xswiftc -DSIWA_LIBFUZZER -Xswiftc -use-ld=lld >/tmp/siwa-fuzz-build.log 2>&1; then
  grep -E "error" /tmp/siwa-fuzz-build.log | sort -u | head -30
  tail -20 /tmp/siwa-fuzz-build.log
  exit 1
fi
echo "    built in $(( $(date +%s) - started )) s"

work=.build/fuzz/corpus
artifacts=.build/fuzz/artifacts
mkdir -p "$work" "$artifacts"
cp -n deploy/fuzz/corpus/* "$work"/ 2>/dev/null || true

echo "==> fuzzing for ${seconds} s"
# -rss_limit_mb bounds memory; -max_len covers the receiver's 64 KiB body cap; -timeout flags an
# input that takes over 10 s (a hang is a finding too).
set +e
ASAN_OPTIONS=detect_leaks=0 .build/fuzz/debug/SiwaFuzz "$work" \
  -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
  -artifact_prefix="$artifacts/" -print_final_stats=1 2>&1 | tee /tmp/siwa-fuzz.log | grep -E "^#|INFO|ERROR|SUMMARY|stat::" | tail -25
status=${PIPESTATUS[0]}
set -e
echo "==> corpus: $(ls "$work" | wc -l) inputs; crashes: $(ls "$artifacts" | wc -l)"
exit "$status"
