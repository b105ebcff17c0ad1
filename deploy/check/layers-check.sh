#!/usr/bin/env bash
# Which module may import which (the imports half of the ownership check; Sources/README.md has the
# map). Every target sits in one layer:
#
#   C wrappers → building blocks → domain modules → application modules → operator commands → executables
#
# A module may import any module of a lower layer, none of a higher one, and one of its own layer
# only where SAME_LAYER below says so. A C library is imported by its one wrapper only; nothing
# imports an executable. Test targets may import any module but an executable. A target in no
# layer fails: a new module is placed here before it is used.
# Prints one line per target and "N passed, N failed"; exit status 0 when all passed.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PATH:/opt/swift/usr/bin"

python3 - <(swift package dump-package) <<'PY'
import json, os, re, sys

LAYERS = [
    ("C wrapper", "CLibpq COpenSSL CMicroHTTPD CCurl CLibssl"),
    ("building block", "Logging Locking Postgres CryptoCore HTTPServer OutboundHTTP JSON JOSE ChildProcesses LocalPostgres"
                       " Metrics Settings Lifecycle ScriptedHTTPServer TestTiming"),
    ("domain", "SiwaModel AppleClient JobQueue Migrations Accounts StoredTokens"),
    ("application", "AppleJobs AppAPI Webhooks TeamTransfer ReceiverCore WorkerCore Console FakeApple"),
    # The `siwa` CLI's commands: they start and drive the application modules (`siwa dev` runs them all).
    ("operator commands", "OperatorCommands"),
    ("executable", "siwa-receiver siwa-worker siwa SiwaFuzz embed-sql"),
]
# The one Swift module that may import each C library.
WRAPPER = {"CLibpq": "Postgres", "COpenSSL": "CryptoCore", "CMicroHTTPD": "HTTPServer", "CCurl": "OutboundHTTP",
           "CLibssl": "ScriptedHTTPServer"}
# Imports inside one layer, each declared.
SAME_LAYER = {
    "Postgres": {"Locking", "Logging"},
    "HTTPServer": {"Locking", "Logging"},
    "OutboundHTTP": {"Locking"},
    "JOSE": {"CryptoCore", "JSON"},
    "ChildProcesses": {"Locking"},
    "LocalPostgres": {"ChildProcesses", "Locking", "Logging"},
    "Metrics": {"Locking"},
    "Settings": {"Logging"},
    "Lifecycle": {"Logging"},
    "AppleClient": {"SiwaModel"},
    "Migrations": set(),
    "Accounts": {"SiwaModel"},           # an account's status is an AccountStatus
    "AppAPI": {"AppleJobs"},              # sign-in exchanges codes through the Apple jobs' context
    "WorkerCore": {"AppAPI", "AppleJobs", "Webhooks"},  # the worker starts them
    "Console": {"Webhooks"},              # the overview reads the webhook queue
    "FakeApple": set(),
    "ScriptedHTTPServer": {"TestTiming"},  # its waits scale by SIWA_TEST_TIME_SCALE
}

package = json.load(open(sys.argv[1]))
targets = {t["name"]: t for t in package["targets"]}
layer = {name: rank for rank, (_, names) in enumerate(LAYERS) for name in names.split()}
layer_name = {rank: title for rank, (title, _) in enumerate(LAYERS)}
import_line = re.compile(r"^\s*(?:@\w+(?:\([^)]*\))?\s+)*(?:(?:internal|package|public|private|fileprivate)\s+)?import\s+(\w+)", re.M)

def imports(target):
    if target["type"] == "system":
        return set()
    root = target.get("path") or os.path.join("Tests" if target["type"] == "test" else "Sources", target["name"])
    found = set()
    for directory, _, files in os.walk(root):
        for file in files:
            if file.endswith(".swift"):
                found |= set(import_line.findall(open(os.path.join(directory, file)).read()))
    return found & set(targets)

passed = failed = 0
for name, target in sorted(targets.items()):
    if target["type"] == "plugin":
        continue
    problems = []
    test = target["type"] == "test"
    if not test and name not in layer:
        problems.append("in no layer (place it in deploy/check/layers-check.sh)")
    for module in sorted(imports(target)):
        if module in WRAPPER and WRAPPER[module] != name:
            problems.append(f"imports {module}, which only {WRAPPER[module]} may import")
        elif module not in layer:
            problems.append(f"imports {module}, which is in no layer")
        elif layer_name[layer[module]] == "executable":
            problems.append(f"imports the executable {module}")
        elif test or name not in layer or module in WRAPPER:
            continue
        elif layer[module] > layer[name]:
            problems.append(f"imports {module}, a module of a higher layer ({layer_name[layer[module]]})")
        elif layer[module] == layer[name] and module not in SAME_LAYER.get(name, set()):
            problems.append(f"imports {module} of its own layer ({layer_name[layer[name]]}) without a declared edge")
    if problems:
        failed += 1
        print(f"FAIL {name}: " + "; ".join(problems))
    else:
        passed += 1
        print(f"ok   {name}")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
