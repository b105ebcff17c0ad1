#!/usr/bin/env bash
# The app API against its own OpenAPI document (GET /v1/openapi.json): the document is validated
# (openapi-spec-validator), then Schemathesis fuzzes the live API from it, bounded in time, against
# `siwa dev` (a throwaway PostgreSQL, the fake Apple, the receiver and the worker serving the app
# API). Fails on any 5xx or any answer the document does not describe. Both tools come from PyPI
# into a virtualenv kept under ~/.cache/siwa-venv and reused when present.
# Usage: deploy/check/app-api-fuzz.sh [SECONDS]   (default 120; needs `swift build` done)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
seconds=${1:-120}
venv=${SIWA_VENV:-$HOME/.cache/siwa-venv}
siwa=.build/debug/siwa
[[ -x "$siwa" ]] || { echo "app-api-fuzz: $siwa is missing: run swift build first" >&2; exit 1; }

if [[ ! -x "$venv/bin/st" || ! -x "$venv/bin/openapi-spec-validator" ]]; then
  echo "app-api-fuzz: installing schemathesis and openapi-spec-validator into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check schemathesis openapi-spec-validator
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/siwa-api-fuzz.XXXXXX")
dev_pid=
cleanup() {
  # `siwa dev` stops everything it started, and deletes its database, on SIGTERM.
  if [[ -n "$dev_pid" ]] && kill -0 "$dev_pid" 2>/dev/null; then
    kill -TERM "$dev_pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$dev_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$dev_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
token=$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')
base="http://127.0.0.1:$port"
SIWA_APP_API_LISTEN="127.0.0.1:$port" SIWA_APP_API_TOKENS="$token" SIWA_LOG_LEVEL=warn \
  "$siwa" dev >"$work/dev.log" 2>&1 &
dev_pid=$!

# Ready when the document answers (bounded: a stack that never comes up fails the check).
ready=
for _ in $(seq 1 600); do
  if curl -fsS -H "Authorization: Bearer $token" "$base/v1/openapi.json" -o "$work/openapi.json" 2>/dev/null; then
    ready=1; break
  fi
  kill -0 "$dev_pid" 2>/dev/null || break
  sleep 0.2
done
if [[ -z "$ready" ]]; then
  echo "app-api-fuzz: the app API did not come up; siwa dev said:" >&2
  tail -40 "$work/dev.log" >&2
  exit 1
fi

echo "==> the OpenAPI document"
"$venv/bin/openapi-spec-validator" "$work/openapi.json"

echo "==> fuzzing $base for at most ${seconds}s"
# Every answer must be described by the document (status, content type, schema), none may be a
# 5xx, input the document forbids must be refused, and every path must need the bearer.
# One worker: with two, Schemathesis generates in two threads, and Hypothesis's lambda-source
# reading (ast.parse) races in CPython 3.11 ("SystemError: AST constructor recursion depth
# mismatch", a KeyError in its source cache): a Runtime Error of the tool, not of the API, failed
# CI once and a helper's run once.
status=0
cd "$work"  # Schemathesis keeps its example database in the current directory
timeout --signal=INT --kill-after=30 "$((seconds + 60))" \
  "$venv/bin/st" run "$work/openapi.json" --url "$base" \
    -H "Authorization: Bearer $token" \
    --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,negative_data_rejection,ignored_auth \
    --phases examples,coverage,fuzzing --max-time "$seconds" --request-timeout 10 --workers 1 \
    --generation-allow-x00 true --no-color || status=$?
if [[ $status -ne 0 ]]; then
  echo "app-api-fuzz: schemathesis failed (exit $status); siwa dev's last lines:" >&2
  tail -20 "$work/dev.log" >&2
  exit 1
fi
cd "$root"
echo "app API fuzz: 1 passed, 0 failed"
