#!/usr/bin/env bash
# Every *_FILE variable a systemd unit or a Kubernetes manifest gives a program must name a file the
# instructions actually create:
#   systemd  Environment=X_FILE=%d/NAME needs LoadCredential=NAME:/etc/siwa/credentials/FILE in the
#            same unit, and deploy/README.md must list /etc/siwa/credentials/FILE.
#   k8s      an env X_FILE=/MOUNT/KEY, MOUNT a volume of Secret S, needs KEY in S in
#            deploy/k8s/secrets.example.yaml and in deploy/README.md's `kubectl create secret generic S`.
# Usage: credentials-check.sh [REPO]     (default: this repository)
#        credentials-check.sh --self-test  (the rule must fail on a copy whose kubectl command lacks a key)
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if [[ ${1:-} == --self-test ]]; then
    copy=$(mktemp -d)
    trap 'rm -rf "$copy"' EXIT
    repo=$(cd "$here/../.." && pwd)
    mkdir -p "$copy/deploy"
    cp -r "$repo/deploy/k8s" "$repo/deploy/systemd" "$repo/deploy/README.md" "$copy/deploy/"
    # The instructions as they once were: the worker's Secret made without app-api-tokens.
    sed -i 's# --from-file=app-api-tokens=[^ ]*##' "$copy/deploy/README.md"
    if out=$(bash "$here/credentials-check.sh" "$copy" 2>&1); then
        echo "FAIL  self-test: the rule passed instructions that lack app-api-tokens"; exit 1
    fi
    grep -q "app-api-tokens" <<<"$out" && { echo "ok    self-test: $(grep -m1 FAIL <<<"$out")"; exit 0; }
    echo "FAIL  self-test: failed without naming app-api-tokens: $out"; exit 1
fi

repo=${1:-$(cd "$here/../.." && pwd)}
python3 - "$repo" <<'PY'
import glob, os, re, shlex, sys
import yaml
repo = sys.argv[1]
readme = open(os.path.join(repo, "deploy/README.md")).read()
failed = 0
def fail(message):
    global failed
    failed += 1
    print("FAIL  " + message)
def ok(message):
    print("ok    " + message)

# systemd
for unit in sorted(glob.glob(os.path.join(repo, "deploy/systemd/*.service"))):
    name = os.path.basename(unit)
    text = open(unit).read()
    credentials = dict(re.findall(r"^LoadCredential=([^:\s]+):(\S+)$", text, re.M))
    for variable, credential in re.findall(r"^Environment=([A-Z_]+_FILE)=%d/(\S+)$", text, re.M):
        source = credentials.get(credential)
        if source is None:
            fail(f"{name}: {variable} reads credential {credential}, which no LoadCredential= provides")
        elif source not in readme:
            fail(f"{name}: {variable} needs {source}, which deploy/README.md never creates")
        else:
            ok(f"{name}: {variable} <- LoadCredential {credential} <- {source} (deploy/README.md)")

# Kubernetes
examples = {}
for document in yaml.safe_load_all(open(os.path.join(repo, "deploy/k8s/secrets.example.yaml"))):
    if document and document.get("kind") == "Secret":
        examples[document["metadata"]["name"]] = set((document.get("stringData") or {}) | (document.get("data") or {}))
commands = {}
for line in re.sub(r"\\\n\s*", " ", readme).splitlines():
    match = re.search(r"kubectl .*create secret generic (\S+)(.*)", line)
    if match:
        keys = set(re.findall(r"--from-(?:file|literal)=([^=\s]+)=", match.group(2)))
        commands[match.group(1)] = keys
for path in sorted(glob.glob(os.path.join(repo, "deploy/k8s/*.yaml"))):
    for document in yaml.safe_load_all(open(path)):
        if not document or document.get("kind") not in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
            continue
        pod = document["spec"]["template"]["spec"]
        volumes = {v["name"]: v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v}
        for container in pod.get("containers", []):
            mounts = {m["mountPath"].rstrip("/"): volumes.get(m["name"]) for m in container.get("volumeMounts", [])}
            for env in container.get("env", []):
                if not env["name"].endswith("_FILE") or "value" not in env:
                    continue
                directory, key = os.path.split(env["value"])
                secret = mounts.get(directory)
                where = f"{os.path.basename(path)}: {env['name']}={env['value']}"
                if secret is None:
                    fail(f"{where}: no Secret is mounted at {directory}")
                    continue
                missing = [what for what, keys in (("secrets.example.yaml", examples.get(secret)),
                                                    ("deploy/README.md's kubectl create secret", commands.get(secret)))
                           if keys is None or key not in keys]
                if missing:
                    fail(f"{where}: Secret {secret} has no key {key} in {' and '.join(missing)}")
                else:
                    ok(f"{where}: key {key} of Secret {secret} is created by the instructions")
print(f"credentials-check: {failed} failed")
sys.exit(1 if failed else 0)
PY
