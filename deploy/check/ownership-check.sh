#!/usr/bin/env bash
# Table ownership, river's shape (one file per table): every statement that writes a `siwa` table
# (a table some sql/0NN_*.sql creates) lives in that table's file under sql/functions/, as a named
# function; everything else calls those functions by name. deploy/check/ownership.txt says which
# file is each table's, the few named functions elsewhere allowed to write it (each with why), and
# which Swift module (or file) may still name a table in its SQL text, for what access (`read`:
# nothing there writes it). Checks, and prints one line per finding:
#   - sql/functions/*.sql: each INSERT INTO / UPDATE / DELETE FROM / MERGE INTO / TRUNCATE of a siwa
#     table is in the table's file, or in a function ownership.txt names for that table;
#   - Sources/**/*.swift: every mention of a siwa table outside comments (any spelling: after FROM,
#     JOIN, a comma, USING, INTO, UPDATE, in quotes, `"siwa"."accounts"`, `siwa . accounts`) is in a
#     module or file allowed to name it, and a write only where the line says `write`;
#   - the list names every table, only tables that exist, one file for each, files that exist.
# Prints "N passed, N failed"; exit status 0 when all passed. It first checks itself on a copy
# with a write in the wrong file and Swift naming tables in each spelling (each must be found).
# OWNERSHIP_SOURCES=dir checks another tree's Sources, OWNERSHIP_SQL=dir another tree's sql/
# (e.g. an older checkout) against this list.
set -euo pipefail
script="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$0")/../.."

# Self-test first: the rule must fail on a copy of sql/ with writes in the wrong file and on Swift
# that names tables in each spelling the check promises to see.
self_test=0
if [[ -z ${OWNERSHIP_SELF_TEST:-} ]]; then
    copy=$(mktemp -d)
    trap 'rm -rf "$copy"' EXIT
    cp -r sql "$copy/sql"
    mkdir -p "$copy/Sources/Probe"
    cat >"$copy/Sources/Probe/Probe.swift" <<'SWIFT'
let comma = "SELECT 1 FROM siwa.jobs j, siwa.accounts a"
let updateFrom = "UPDATE siwa.jobs x SET y = 1 FROM siwa.notifications n, siwa.accounts a"
let insert = #"INSERT INTO "siwa"."accounts" (client_id) VALUES ($1)"#
let using = "DELETE FROM siwa.jobs j USING siwa . accounts a WHERE true"
let quoted = "SELECT * FROM siwa.jobs JOIN siwa.\"accounts\" ON true"
let multiLine = """
    SELECT 1
      FROM siwa.jobs j,
           siwa.accounts a
    """
SWIFT
    cat >>"$copy/sql/functions/webhooks.sql" <<'SQL'
CREATE OR REPLACE FUNCTION siwa.probe() RETURNS void LANGUAGE sql AS $$
    UPDATE siwa.accounts SET status = status;
    INSERT INTO "siwa"."jobs" (kind) VALUES ('x');
    DELETE FROM siwa . notifications WHERE false;
$$;
SQL
    out=$(OWNERSHIP_SELF_TEST=1 OWNERSHIP_SOURCES="$copy/Sources" OWNERSHIP_SQL="$copy/sql" bash "$script" 2>&1) && self_test=1
    accounts=$(grep "FAIL  Probe names siwa.accounts at" <<<"$out" || true)
    for line in 1 2 3 4 5 9; do
        grep -E "Probe.swift:$line[,:]" <<<"$accounts" >/dev/null ||
            { echo "  FAIL  self-test: the check missed siwa.accounts in Probe.swift:$line"; self_test=1; }
    done
    for table in accounts jobs notifications; do
        grep -F "siwa.probe writes siwa.$table:" <<<"$out" >/dev/null ||
            { echo "  FAIL  self-test: the check missed siwa.probe's write of siwa.$table in webhooks.sql"; self_test=1; }
    done
    [ "$self_test" -eq 0 ] && echo "  ok    self-test: the check fails on writes in the wrong file and on every spelling of a table in Swift"
fi

python3 - "${OWNERSHIP_SOURCES:-Sources}" deploy/check/ownership.txt "${OWNERSHIP_SQL:-sql}" <<'PY'
import os, re, sys

sources, listing, sql_dir = sys.argv[1:4]
functions_dir = os.path.join(sql_dir, "functions")
tables = set()
for name in sorted(os.listdir(sql_dir)):
    if re.match(r"\d{3}_.*\.sql$", name):
        text = open(os.path.join(sql_dir, name)).read()
        tables |= set(re.findall(r'(?i)CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?"?siwa"?\s*\.\s*"?(\w+)"?', text))

passed = failed = 0
def ok(text):
    global passed; passed += 1; print(f"  ok    {text}")
def fail(text):
    global failed; failed += 1; print(f"  FAIL  {text}")

# ownership.txt: `table owner access why...`, `#` comments. owner: `file.sql` (the table's file:
# access `write`), `file.sql:siwa.function` (that function may write the table from another file),
# `-` (no SQL function writes it), a Swift module (folder under Sources/) or a file path under it.
home = {}        # table -> its file
elsewhere = {}   # (table, file, function) -> why
allowed = {}     # (table, module or Swift file) -> access
listed = set()
for number, line in enumerate(open(listing), 1):
    line = line.split("#", 1)[0].strip()
    if not line:
        continue
    parts = line.split(None, 3)
    if len(parts) < 4 or parts[2] not in ("read", "write"):
        fail(f"{listing}:{number}: not `table owner read|write why`: {line}")
        continue
    table, owner, access, why = parts
    listed.add(table)
    if table not in tables:
        fail(f"{listing}:{number}: siwa.{table} is no table of sql/0NN_*.sql")
    if owner == "-":  # no SQL function writes it: only the Swift lines below
        if table in home:
            fail(f"{listing}:{number}: siwa.{table} has two files ({home[table]}, -)")
        home[table] = None
    elif ".sql" in owner:
        file, _, function = owner.partition(":")
        if not os.path.exists(os.path.join(functions_dir, file)):
            fail(f"{listing}:{number}: no {functions_dir}/{file}")
        if function:
            elsewhere[(table, file, function.removeprefix("siwa."))] = why
        elif table in home:
            fail(f"{listing}:{number}: siwa.{table} has two files ({home[table]}, {file})")
        else:
            home[table] = file
    else:
        allowed[(table, owner)] = access
for table in sorted(tables - listed):
    fail(f"siwa.{table} has no line in {listing} (its file under sql/functions/, and who else may name it)")
for table in sorted(tables & listed - set(home)):
    fail(f"siwa.{table} has no file in {listing} (`{table} <file>.sql write why`)")

# A table, however it is spelled: siwa.accounts, "siwa"."accounts", siwa . "accounts".
Q = r'(?:\\?")?'  # a quote, escaped in a Swift literal or not
TABLE = Q + r'siwa' + Q + r'\s*\.\s*' + Q + r'(\w+)'
WRITE = re.compile(r'(?i)(?<![\w.])(insert\s+into|merge\s+into|delete\s+from|truncate(?:\s+table)?|update)\s+(?:only\s+)?'
                   + r'(?:' + Q + r'siwa' + Q + r'\s*\.\s*)?' + Q + r'(\w+)')
NOT_A_WRITE = re.compile(r"(?i)(for|do|key|no\s+key)\s*$")  # FOR UPDATE, ON CONFLICT DO UPDATE

def writes(text):
    """(statement offset, table name offset, table) of every write of a siwa table in text."""
    for m in WRITE.finditer(text):
        if m.group(1).lower() == "update" and NOT_A_WRITE.search(text[max(0, m.start() - 12):m.start()]):
            continue
        if m.group(2) in tables:
            yield m.start(), m.start(2), m.group(2)

# SQL: comments out (`-- ...` to the end of the line, `/* ... */`), strings kept (a write in
# EXECUTE's text counts too).
def strip_sql_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    return re.sub(r"--[^\n]*", "", text)

sql_findings = {}  # (table, file, function) -> count
for file in sorted(os.listdir(functions_dir)):
    if not file.endswith(".sql"):
        continue
    text = strip_sql_comments(open(os.path.join(functions_dir, file)).read())
    heads = [(m.start(), m.group(1)) for m in
             re.finditer(r'(?i)CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+"?siwa"?\s*\.\s*"?(\w+)"?', text)]
    for offset, _, table in writes(text):
        function = next((name for start, name in reversed(heads) if start < offset), "(outside a function)")
        line = text.count("\n", 0, offset) + 1
        sql_findings.setdefault((table, file, function), []).append(line)
for (table, file, function), lines in sorted(sql_findings.items()):
    where = f"{file}:{','.join(map(str, lines))} siwa.{function}"
    if home.get(table) is not None and home.get(table) == file:
        ok(f"{where} writes siwa.{table} in its file")
    elif (table, file, function) in elsewhere:
        ok(f"{where} writes siwa.{table} outside {home.get(table)}, as {listing} allows")
    else:
        fail(f"{where} writes siwa.{table}: only {home.get(table, 'its file')} may "
             f"(move the statement there as a named function)")
for (table, file, function) in sorted(elsewhere):
    if (table, file, function) not in sql_findings:
        fail(f"{listing}: {file}:siwa.{function} is allowed to write siwa.{table} but does not (drop the line)")

# Swift: SQL is text in string literals ("...", """...""", raw #"..."#); a literal is SQL when it
# holds a keyword of a statement (prose like help text and log lines does not count). Every
# mention of a table in SQL counts, wherever in the statement (after a comma, USING, in quotes).
LITERAL = re.compile(r'(#*)"""(.*?)"""\1|(#+)"(.*?)"\3|()"((?:\\.|[^"\\\n])*)"', re.S)
SQL_WORDS = re.compile(r"(?i)\b(select|insert\s+into|delete\s+from|merge\s+into|truncate|join|regclass|returning)\b"
                       r"|\bUPDATE\s+\S+\s+SET\b|\bFROM\b|\bUSING\b")
mention = re.compile(r"(?<![\w.])" + TABLE)
found = {}  # (module or file, table) -> [(path:line, write)]
for directory, _, files in os.walk(sources):
    for file in sorted(files):
        if not file.endswith(".swift"):
            continue
        path = os.path.join(directory, file)
        relative = os.path.relpath(path, sources)
        module = relative.split(os.sep)[0]
        text = re.sub(r"(?m)^\s*//.*$", "", open(path, encoding="utf-8").read())  # comment lines, newlines kept
        for literal in LITERAL.finditer(text):
            group = next(g for g in (2, 4, 6) if literal.group(g) is not None)
            body, base = literal.group(group), literal.start(group)
            if not SQL_WORDS.search(body):
                continue
            written = {at for _, at, _ in writes(body)}
            for m in mention.finditer(body):
                table = m.group(1)
                if table not in tables:
                    continue
                line = text.count("\n", 0, base + m.start()) + 1
                owner = relative if (table, relative) in allowed else module  # a file's own line first
                found.setdefault((owner, table), []).append((f"{path}:{line}", m.start(1) in written))

for (module, table), places in sorted(found.items()):
    access = allowed.get((table, module))
    writes_at = [place for place, write in places if write]
    if access == "write" or (access == "read" and not writes_at):
        ok(f"{module} names siwa.{table} ({access}, {len(places)} place(s))")
    elif access == "read":
        fail(f"{module} may only read siwa.{table}, writes it at {', '.join(writes_at)}")
    else:
        may = sorted(f"{m} ({allowed[(t, m)]})" for (t, m) in allowed if t == table)
        fail(f"{module} names siwa.{table} at {', '.join(p for p, _ in places)}: "
             f"{listing} lets only {', '.join(may) or 'SQL functions'} name it (call a function of {home.get(table) or 'SQL'})")

print(f"ownership-check: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
[ "$self_test" -eq 0 ]
