#!/usr/bin/env bash
# Table ownership: SQL text that names a `siwa.<table>` (a table some sql/0NN_*.sql creates) lives
# only in a Swift module (or, for what has not moved yet, a file) that deploy/check/ownership.txt
# allows to name it, for the access it allows (`read`: only SELECTs name it there). Everything else calls SQL functions by name. Also
# checks that the list names every table, and only tables that exist.
# Counts as SQL a table named after FROM, JOIN, INTO, UPDATE, TABLE or inside quotes
# (`to_regclass('siwa.x')`); prose (comments, log lines, help text) does not count. A write is a
# table named after INTO, UPDATE, TABLE or DELETE FROM.
# Prints one line per finding and "N passed, N failed"; exit status 0 when all passed.
# OWNERSHIP_SOURCES=dir checks another tree's Sources (e.g. an older checkout) against this list.
set -euo pipefail
cd "$(dirname "$0")/../.."

python3 - "${OWNERSHIP_SOURCES:-Sources}" deploy/check/ownership.txt sql <<'PY'
import os, re, sys

sources, listing, sql_dir = sys.argv[1:4]
tables = set()
for name in sorted(os.listdir(sql_dir)):
    if re.match(r"\d{3}_.*\.sql$", name):
        tables |= set(re.findall(r"CREATE TABLE (?:IF NOT EXISTS )?siwa\.(\w+)", open(os.path.join(sql_dir, name)).read()))

# ownership.txt: `table module access why...`, `#` comments.
allowed = {}  # (table, module) -> access
listed = set()
passed = failed = 0
def ok(text):
    global passed; passed += 1; print(f"  ok    {text}")
def fail(text):
    global failed; failed += 1; print(f"  FAIL  {text}")

for number, line in enumerate(open(listing), 1):
    line = line.split("#", 1)[0].strip()
    if not line:
        continue
    parts = line.split(None, 3)
    if len(parts) < 4 or parts[2] not in ("read", "write"):
        fail(f"{listing}:{number}: not `table module read|write why`: {line}")
        continue
    table, module, access = parts[:3]
    listed.add(table)
    if table not in tables:
        fail(f"{listing}:{number}: siwa.{table} is no table of sql/0NN_*.sql")
    allowed[(table, module)] = access
for table in sorted(tables - listed):
    fail(f"siwa.{table} has no line in {listing} (say who owns it, or `- write` for SQL functions only)")

mention = re.compile(r"(?i)(delete\s+from|from|join|into|update|table|')\s*siwa\.(\w+)\b")
found = {}  # (module or file, table) -> [(path:line, write)]
for directory, _, files in os.walk(sources):
    for file in sorted(files):
        if not file.endswith(".swift"):
            continue
        path = os.path.join(directory, file)
        relative = os.path.relpath(path, sources)
        module = relative.split(os.sep)[0]
        for number, text in enumerate(open(path, encoding="utf-8"), 1):
            if text.lstrip().startswith("//"):
                continue
            for keyword, table in mention.findall(text):
                if table not in tables:
                    continue
                write = keyword.lower().split()[0] in ("delete", "into", "update", "table")
                owner = relative if (table, relative) in allowed else module  # a file's own line first
                found.setdefault((owner, table), []).append((f"{path}:{number}", write))

for (module, table), places in sorted(found.items()):
    access = allowed.get((table, module))
    writes = [place for place, write in places if write]
    if access == "write" or (access == "read" and not writes):
        ok(f"{module} names siwa.{table} ({access}, {len(places)} place(s))")
    elif access == "read":
        fail(f"{module} may only read siwa.{table}, writes it at {', '.join(writes)}")
    else:
        may = sorted("SQL functions" if m == "-" else f"{m} ({allowed[(t, m)]})" for (t, m) in allowed if t == table)
        fail(f"{module} names siwa.{table} at {', '.join(p for p, _ in places)}: "
             f"{listing} lets only {', '.join(may) or 'nobody'} name it")

print(f"ownership-check: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
