#!/usr/bin/env bash
# Package.swift's dependency lists are exact: every module a target's Swift files import is
# declared, and every declared dependency is imported by at least one of its files. The build's
# `--explicit-target-dependency-import-check error` catches only the first half, and accepts a
# module reached through another dependency; this checks both against the direct list.
# Prints one line per target and "N passed, N failed"; exit status 0 when all passed.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PATH:/opt/swift/usr/bin"

manifest=$(mktemp)
trap 'rm -f "$manifest"' EXIT
swift package dump-package >"$manifest"

python3 - "$manifest" <<'EOF'
import json, os, re, sys

package = json.load(open(sys.argv[1]))
targets = {t["name"]: t for t in package["targets"]}
# `import X`, `package import X`, `@testable import X`, … at the start of a line, also inside #if.
import_line = re.compile(r"^\s*(?:@\w+(?:\([^)]*\))?\s+)*(?:(?:internal|package|public|private|fileprivate)\s+)?import\s+(\w+)", re.M)

passed = failed = 0
for name, target in sorted(targets.items()):
    # A plugin's dependencies are tools it runs, not modules it imports.
    if target["type"] in ("system", "plugin"):
        continue
    root = target.get("path") or os.path.join("Tests" if target["type"] == "test" else "Sources", name)
    imported = set()
    for directory, _, files in os.walk(root):
        for file in files:
            if file.endswith(".swift"):
                imported |= set(import_line.findall(open(os.path.join(directory, file)).read()))
    imported &= set(targets)  # modules of this package only (not Foundation, Testing, …)
    declared = {d["byName"][0] for d in target.get("dependencies", []) if "byName" in d}
    missing, unused = sorted(imported - declared), sorted(declared - imported)
    if missing or unused:
        failed += 1
        print(f"FAIL {name}: imported but not declared {missing}; declared but not imported {unused}")
    else:
        passed += 1
        print(f"ok   {name}")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
EOF
