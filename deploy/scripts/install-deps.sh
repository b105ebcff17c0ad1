#!/usr/bin/env bash
# Installs the Debian packages the project builds and runs with, only those missing.
# Usage: deploy/scripts/install-deps.sh [extra packages...]
set -euo pipefail

# curl and ca-certificates: the tests' independent client for the local servers' https://.
# binutils: readelf, for deploy/check/runtime-libs.sh (the libraries the binaries load).
packages=(libpq-dev libssl-dev libmicrohttpd-dev libcurl4-openssl-dev pkg-config postgresql curl ca-certificates binutils "$@")
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done

if ((${#missing[@]})); then
  echo "==> installing Debian packages: ${missing[*]}"
  run_root=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    run_root=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  # A fresh machine has no package lists yet; a stale list can also miss the packages.
  "${run_root[@]}" apt-get update -qq
  "${run_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v swift >/dev/null; then
  for candidate in /opt/swift/usr/bin /usr/share/swift/usr/bin; do
    [ -x "$candidate/swift" ] && { echo "==> swift found at $candidate; add it to PATH" >&2; break; }
  done
  echo "the Swift 6 toolchain is required (https://www.swift.org/install/linux/); it is not a Debian package" >&2
  exit 1
fi
