#!/usr/bin/env bash
# The runtime image installs exactly what the binaries load: every shared library the three
# executables name (their ELF NEEDED entries) must come from a package the Dockerfile's runtime
# stage installs or from one debian:bookworm-slim already has; and every package that stage
# installs must be needed by a binary (ca-certificates aside: it is data, libcurl's trust store).
# Swift's own runtime libraries are left out: the image's build links them in (--static-swift-stdlib).
# Transitive libraries (libcurl's nghttp2, libpq's ldap...) are apt's to resolve from the packages.
# Usage: deploy/check/runtime-libs.sh [BIN_DIR]   (default: .build/debug; needs those binaries and dpkg)
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-.build/debug}
dockerfile=deploy/docker/Dockerfile
# What debian:bookworm-slim holds already (Essential and apt's own dependencies).
base="libc6 libgcc-s1 libstdc++6 zlib1g"

passed=0 failed=0
ok() { echo "  ok    $*"; passed=$((passed + 1)); }
fail() { echo "  FAIL  $*"; failed=$((failed + 1)); }

last_from=$(grep -n '^FROM ' "$dockerfile" | tail -1 | cut -d: -f1)
installed=$(tail -n +"$last_from" "$dockerfile" | grep -o 'apt-get install [^&]*' | tr ' ' '\n' \
  | grep -Ev '^(apt-get|install|-.*|\\)?$' | sort -u | tr '\n' ' ')
echo "runtime stage installs: $installed"

needed=()
for binary in siwa siwa-receiver siwa-worker; do
  [[ -x "$bin/$binary" ]] || { echo "runtime-libs: $bin/$binary is missing: build first" >&2; exit 1; }
  while read -r lib; do needed+=("$lib"); done < <(readelf -d "$bin/$binary" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
done
used=" "
for lib in $(printf '%s\n' "${needed[@]}" | sort -u); do
  case $lib in
    libswift*|libFoundation*|lib_Foundation*|libdispatch.so|libBlocksRuntime.so) continue ;;  # linked in statically by the image
  esac
  # awk reads to the end (no `exit`): ldconfig killed by SIGPIPE would fail the pipeline under
  # pipefail and stop the script here, as it did once in a fresh clone's CI.
  path=$(ldconfig -p | awk -v l="$lib" '!found && $1 == l && /x86-64|x86_64|AArch64|aarch64/ {print $NF; found = 1}')
  [[ -n "$path" ]] || { fail "$lib: not found on this machine"; continue; }
  package=$(dpkg -S "$(readlink -f "$path")" 2>/dev/null | head -1 | cut -d: -f1) || true
  [[ -n "$package" ]] || package=$(dpkg -S "$path" 2>/dev/null | head -1 | cut -d: -f1) || true
  if [[ " $installed " == *" $package "* ]]; then
    ok "$lib from $package (installed by the runtime stage)"; used+="$package "
  elif [[ " $base " == *" $package "* ]]; then
    ok "$lib from $package (in debian:bookworm-slim)"
  else
    fail "$lib from ${package:-no package}: the runtime stage does not install it"
  fi
done
for package in $installed; do
  [[ $package == ca-certificates || "$used" == *" $package "* ]] && continue
  fail "$package is installed but no binary loads a library of it"
done
echo "runtime-libs: $passed passed, $failed failed"
[[ $failed == 0 ]]
