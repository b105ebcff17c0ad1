#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs the whole suite. The integration
# tests start their own throwaway PostgreSQL (set TEST_DATABASE_URL to use an existing one).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/opt/swift/usr/bin"

deploy/scripts/install-deps.sh

echo "==> building"
swift build --build-tests -Xswiftc -warnings-as-errors 2>&1 | grep -v '^\[' || true
swift build --build-tests -Xswiftc -warnings-as-errors >/dev/null

echo "==> testing"
swift test --skip-build "$@"
