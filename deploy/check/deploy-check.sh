#!/usr/bin/env bash
# Validates the deployment files as far as this machine can, and says what it checked:
#   systemd  systemd-analyze verify on copies of the units whose ExecStart points at stub
#            executables (the real binaries are not installed here), plus the required hardening,
#            ordering, stop timeout and credential settings; siwa.env.example lists every variable
#            of the contract's configuration table.
#   credentials  every *_FILE a unit or manifest reads has its LoadCredential= / Secret key in the
#            instructions that create it (credentials-check.sh, with a self-test).
#   nginx    nginx -t on the site config inside a throwaway nginx.conf with a self-signed cert,
#            then a real nginx on a free port in front of a stub receiver: POST is proxied with
#            X-Forwarded-For, other paths 404, other methods 405, >64k 413, TLS 1.2/1.3 only.
#   k8s      every manifest parsed with PyYAML; required fields, probes, security contexts,
#            resources, secrets as read-only files, labels/selectors, kustomization coverage;
#            `kubectl kustomize` when kubectl is present.
#   docker   Dockerfile linted by reading it (no Docker engine here: it is not built).
#   monitoring  promtool check rules on deploy/monitoring/siwa-alerts.yml; the Grafana dashboard is
#            valid JSON; every metric the rules and the dashboard name is exported by the code; an
#            alert rule for every row of deploy/README.md's "What to alert on".
# Installs nginx / python3-yaml / prometheus (for promtool) with apt-get only when missing. Exit status 0 when all passed.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
deploy=$repo/deploy
tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT

passed=0
failed=0
skipped=0
ok()   { passed=$((passed + 1)); echo "  ok    $*"; }
fail() { failed=$((failed + 1)); echo "  FAIL  $*"; }
skip() { skipped=$((skipped + 1)); echo "  skip  $*"; }

apt_updated=
apt_install() {  # apt_install PKG...: install, running apt-get update first if needed
    [[ $(id -u) -eq 0 ]] || return 1
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q --no-install-recommends "$@" >"$tmp/apt.log" 2>&1; then
        [[ -n $apt_updated ]] && return 1
        apt-get update -q >>"$tmp/apt.log" 2>&1 && apt_updated=1
        apt-get install -y -q --no-install-recommends "$@" >>"$tmp/apt.log" 2>&1
    fi
}
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null \
        || echo $((20000 + RANDOM % 20000))
}

# ---------------------------------------------------------------------------------------------
echo "== systemd units (deploy/systemd)"
sd=$deploy/systemd
units=(siwa-migrate.service siwa-receiver.service siwa-worker@.service siwa-console.service)
for u in "${units[@]}"; do [[ -f $sd/$u ]] && ok "$u exists" || fail "$u missing"; done

if ! command -v systemd-analyze >/dev/null; then apt_install systemd || true; fi
if command -v systemd-analyze >/dev/null; then
    # Copies with ExecStart pointing at stub executables in a temp dir: verify checks that the
    # binary exists and is executable. Everything else in the files is verified as written.
    mkdir -p "$tmp/units" "$tmp/bin"
    for b in siwa siwa-receiver siwa-worker; do printf '#!/bin/sh\nexit 0\n' >"$tmp/bin/$b"; chmod +x "$tmp/bin/$b"; done
    for u in "${units[@]}"; do sed "s#/usr/local/bin/#$tmp/bin/#g" "$sd/$u" >"$tmp/units/$u"; done
    ln -s siwa-worker@.service "$tmp/units/siwa-worker@1.service"
    for u in siwa-migrate.service siwa-receiver.service siwa-worker@1.service siwa-console.service; do
        # Messages about the host (no systemd running as PID 1 in a container, other units) are
        # not ours: keep only lines naming our unit files.
        out=$(cd "$tmp/units" && SYSTEMD_LOG_LEVEL=notice systemd-analyze verify --man=no "$tmp/units/$u" 2>&1)
        rc=$?
        ours=$(grep -E "siwa-(migrate|receiver|worker|console)" <<<"$out" | grep -v 'Failed to open /etc/siwa' || true)
        if [[ $rc -eq 0 && -z $ours ]]; then
            ok "systemd-analyze verify $u"
        elif [[ -z $ours ]]; then
            # A non-zero status with nothing about our units: the host, not the files.
            ok "systemd-analyze verify $u (no finding in our units; host said: $(head -1 <<<"$out"))"
        else
            fail "systemd-analyze verify $u: $ours"
        fi
    done
else
    skip "systemd-analyze not available"
fi

hardening=(DynamicUser=yes ProtectSystem=strict ProtectHome=yes PrivateTmp=yes NoNewPrivileges=yes
    PrivateDevices=yes ProtectKernelTunables=yes ProtectKernelModules=yes ProtectKernelLogs=yes
    ProtectControlGroups=yes "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX" RestrictNamespaces=yes
    LockPersonality=yes MemoryDenyWriteExecute=yes SystemCallFilter=@system-service
    CapabilityBoundingSet= UMask=0077 EnvironmentFile=/etc/siwa/siwa.env)
for u in "${units[@]}"; do
    missing=()
    for h in "${hardening[@]}"; do grep -qxF "$h" "$sd/$u" || missing+=("$h"); done
    [[ ${#missing[@]} -eq 0 ]] && ok "$u: all hardening settings" || fail "$u lacks: ${missing[*]}"
    grep -qx 'Environment=DATABASE_URL_FILE=%d/database-url' "$sd/$u" \
        && grep -q '^LoadCredential=database-url:' "$sd/$u" \
        && ok "$u: DATABASE_URL from a credential" || fail "$u: DATABASE_URL_FILE credential missing"
done
for u in siwa-receiver.service siwa-worker@.service; do
    grep -qx 'Requires=siwa-migrate.service' "$sd/$u" && grep -Eq '^After=.*siwa-migrate\.service' "$sd/$u" \
        && ok "$u: Requires= and After= siwa-migrate.service" || fail "$u: not ordered after siwa-migrate"
    grep -qx 'Restart=on-failure' "$sd/$u" && ok "$u: Restart=on-failure" || fail "$u: Restart=on-failure missing"
    t=$(sed -n 's/^TimeoutStopSec=\([0-9]*\)s\{0,1\}$/\1/p' "$sd/$u")
    [[ -n $t && $t -gt 30 ]] && ok "$u: TimeoutStopSec=${t}s > 30 s grace" || fail "$u: TimeoutStopSec '$t' not above 30 s"
done
# Descriptors: the receiver holds one per connection; systemd's default soft limit (1024) is below
# the default SIWA_RECEIVER_CONNECTION_LIMIT (2048).
nofile=$(sed -n 's/^LimitNOFILE=\([0-9]*\)$/\1/p' "$sd/siwa-receiver.service")
climit=$(sed -n 's/^#\{0,1\}SIWA_RECEIVER_CONNECTION_LIMIT=\([0-9]*\)$/\1/p' "$sd/siwa.env.example")
[[ -n $nofile && -n $climit && $nofile -ge $((climit + 64)) ]] \
    && ok "receiver: LimitNOFILE=$nofile covers SIWA_RECEIVER_CONNECTION_LIMIT=$climit" \
    || fail "receiver: LimitNOFILE '$nofile' below SIWA_RECEIVER_CONNECTION_LIMIT '$climit' + 64"
grep -qx 'ExecStart=/usr/local/bin/siwa migrate' "$sd/siwa-migrate.service" && grep -qx 'Type=oneshot' "$sd/siwa-migrate.service" \
    && ok "siwa-migrate: oneshot running /usr/local/bin/siwa migrate" || fail "siwa-migrate: ExecStart/Type"
grep -qx 'ExecStart=/usr/local/bin/siwa-receiver' "$sd/siwa-receiver.service" && ok "receiver ExecStart" || fail "receiver ExecStart"
grep -qx 'ExecStart=/usr/local/bin/siwa-worker' "$sd/siwa-worker@.service" && ok "worker ExecStart" || fail "worker ExecStart"
for v in 'SIWA_PRIVATE_KEY_FILE=%d/apple-key.p8' 'SIWA_TOKEN_KEYS_FILE=%d/token-keys'; do
    grep -qx "Environment=$v" "$sd/siwa-worker@.service" && ok "worker: $v" || fail "worker: $v missing"
done
grep -q '^LoadCredential=apple-key.p8:' "$sd/siwa-worker@.service" && grep -q '^LoadCredential=token-keys:' "$sd/siwa-worker@.service" \
    && ok "worker: key and token keys as credentials" || fail "worker: LoadCredential for key/token keys"
if grep -Eq 'LoadCredential=(apple-key|token-keys)|SIWA_(PRIVATE_KEY|TOKEN_KEYS)' "$sd/siwa-receiver.service"; then
    fail "receiver is given Apple secrets"
else
    ok "receiver gets no Apple secrets"
fi

# Configuration table: from the contract when it is beside the repository (CI, worktrees), else
# the table as known when this was written.
contract=""
for c in "${SIWA_CONTRACT:-}" "$repo/../shared/CONTRACT.md" "$repo/../../shared/CONTRACT.md"; do
    [[ -n $c && -f $c ]] && { contract=$c; break; }
done
if [[ -n $contract ]]; then
    vars=$(awk '/^## Configuration/{on=1; next} /^## /{on=0} on && /^\| `/' "$contract" \
        | cut -d'|' -f2 | grep -o '`[A-Z_]*`' | tr -d '`' | sort -u)
    src="contract $contract"
else
    vars="DATABASE_URL SIWA_CLIENT_IDS SIWA_LISTEN SIWA_NOTIFICATION_PATH SIWA_APPLE_BASE_URL SIWA_TEAM_ID
          SIWA_KEY_ID SIWA_PRIVATE_KEY_FILE SIWA_TOKEN_KEYS SIWA_WORKER_CONCURRENCY SIWA_RETENTION_DAYS
          SIWA_OPS_LISTEN SIWA_LOG_LEVEL"
    src="built-in list (contract not found)"
fi
missing=()
for v in $vars; do grep -Eq "^#?$v=" "$sd/siwa.env.example" || missing+=("$v"); done
[[ -n $vars && ${#missing[@]} -eq 0 ]] && ok "siwa.env.example documents all $(wc -w <<<"$vars") variables ($src)" \
    || fail "siwa.env.example lacks: ${missing[*]} ($src)"
if grep -Eq '^(DATABASE_URL|DATABASE_URL_FILE|SIWA_TOKEN_KEYS|SIWA_TOKEN_KEYS_FILE|SIWA_PRIVATE_KEY_FILE|SIWA_OPS_LISTEN)=' "$sd/siwa.env.example"; then
    fail "siwa.env.example sets a secret or a unit-owned variable"
else
    ok "siwa.env.example sets no secret and nothing the units set"
fi

echo "== credentials (every *_FILE a unit or manifest reads is created by the instructions)"
if out=$(bash "$here/credentials-check.sh" 2>&1); then
    ok "every *_FILE has its LoadCredential= / Secret key in deploy/README.md and secrets.example.yaml ($(grep -c '^ok' <<<"$out") checked)"
else
    fail "credentials: $(grep FAIL <<<"$out" | tr '\n' ' ')"
fi
if out=$(bash "$here/credentials-check.sh" --self-test 2>&1); then
    ok "the credentials rule fails on instructions that lack a key (self-test)"
else
    fail "credentials rule: $out"
fi

# ---------------------------------------------------------------------------------------------
echo "== nginx (deploy/nginx/siwa.conf)"
if ! command -v nginx >/dev/null; then apt_install nginx-light || apt_install nginx || true; fi
if command -v nginx >/dev/null && command -v openssl >/dev/null; then
    n=$tmp/nginx
    mkdir -p "$n/ssl" "$n/log"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
        -subj /CN=siwa.example.com -keyout "$n/ssl/privkey.pem" -out "$n/ssl/fullchain.pem" >/dev/null 2>&1
    user_line=""; [[ $(id -u) -eq 0 ]] && user_line="user root;"
    write_conf() {  # write_conf LISTEN_PORT UPSTREAM_PORT
        sed -e "s#/etc/ssl/siwa/#$n/ssl/#g" -e "s#/var/log/nginx/#$n/log/#g" \
            -e "s#listen 443 ssl;#listen 127.0.0.1:$1 ssl;#" -e "/listen \[::\]:443 ssl;/d" \
            -e "s#server 127.0.0.1:8080 #server 127.0.0.1:$2 #" \
            "$deploy/nginx/siwa.conf" >"$n/siwa.conf"
        cat >"$n/nginx.conf" <<EOF
$user_line
worker_processes 1;
pid $n/nginx.pid;
error_log $n/log/error.log;
events { worker_connections 64; }
http {
    access_log off;
    client_body_temp_path $n/body; proxy_temp_path $n/proxy; fastcgi_temp_path $n/fastcgi;
    uwsgi_temp_path $n/uwsgi; scgi_temp_path $n/scgi;
    include $n/siwa.conf;
}
EOF
    }
    # nginx -t on the file as written, only paths rewritten (IPv6 listen kept).
    sed -e "s#/etc/ssl/siwa/#$n/ssl/#g" -e "s#/var/log/nginx/#$n/log/#g" "$deploy/nginx/siwa.conf" >"$n/siwa.conf"
    write_conf 443 8080
    sed -e "s#/etc/ssl/siwa/#$n/ssl/#g" -e "s#/var/log/nginx/#$n/log/#g" "$deploy/nginx/siwa.conf" >"$n/siwa.conf"
    if out=$(nginx -t -e "$n/log/error.log" -p "$n/" -c "$n/nginx.conf" 2>&1); then
        ok "nginx -t ($(nginx -v 2>&1 | sed 's/.*: //'))"
    else
        fail "nginx -t: $out"
    fi
    grep -q 'ssl_protocols TLSv1.2 TLSv1.3;' "$deploy/nginx/siwa.conf" && ok "ssl_protocols TLSv1.2 TLSv1.3" || fail "ssl_protocols"
    grep -q 'client_max_body_size 64k;' "$deploy/nginx/siwa.conf" && ok "client_max_body_size 64k" || fail "client_max_body_size"
    grep -q 'request_body' "$deploy/nginx/siwa.conf" && fail "a log format mentions the request body" || ok "no request body in the access log format"
    [[ $(grep -c '^ *location ' "$deploy/nginx/siwa.conf") -eq 3 ]] && ok "three locations: the endpoint, the app API refused, a catch-all 404" || fail "unexpected locations"
    [[ $(grep -c 'proxy_pass' "$deploy/nginx/siwa.conf") -eq 1 ]] && ! grep -q '8081' "$deploy/nginx/siwa.conf" \
        && ok "one proxy_pass (the receivers); the app API is not an upstream" || fail "nginx proxies something besides the receivers"

    # Run it: a stub receiver records what it is sent and answers 200.
    up=$(free_port); tls=$(free_port)
    write_conf "$tls" "$up"
    cat >"$tmp/stub.py" <<'EOF'
import http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with open(sys.argv[2], "a") as f:
            f.write(json.dumps({"path": self.path, "xff": self.headers.get("X-Forwarded-For"),
                                "proto": self.headers.get("X-Forwarded-Proto"), "len": len(body)}) + "\n")
        out = b'{"status":"ok"}'
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out))); self.end_headers(); self.wfile.write(out)
    do_GET = do_POST
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
EOF
    python3 "$tmp/stub.py" "$up" "$tmp/seen" 2>"$tmp/stub.err" & pids+=($!)
    for _ in $(seq 50); do curl -s -o /dev/null -X POST "http://127.0.0.1:$up/probe" && break; sleep 0.1; done
    : >"$tmp/seen"
    # In the foreground as our child, so it is stopped (and reaped) with the stub at exit.
    nginx -e "$n/log/error.log" -p "$n/" -c "$n/nginx.conf" -g 'daemon off;' 2>"$n/start.err" & pids+=($!)
    for _ in $(seq 50); do curl -sk -o /dev/null "https://127.0.0.1:$tls/" && break; sleep 0.1; done
    if curl -sk -o /dev/null "https://127.0.0.1:$tls/"; then
        u="https://127.0.0.1:$tls"
        code() { curl -sk -o /dev/null -w '%{http_code}' "$@"; }
        c=$(code -X POST -H 'Content-Type: application/json' -d '{"payload":"a.b.c"}' "$u/apple/notifications")
        [[ $c == 200 ]] && ok "POST /apple/notifications proxied (200 from the stub)" || fail "POST /apple/notifications: $c ($(grep -m1 error "$n/log/siwa.error.log" 2>/dev/null))"
        grep -q '"xff": "127.0.0.1"' "$tmp/seen" 2>/dev/null && grep -q '"proto": "https"' "$tmp/seen" \
            && ok "upstream got X-Forwarded-For and X-Forwarded-Proto" || fail "forwarded headers: $(cat "$tmp/seen" 2>/dev/null)"
        c=$(code "$u/apple/notifications"); [[ $c == 405 ]] && ok "GET /apple/notifications -> 405" || fail "GET endpoint: $c"
        for p in /healthz /readyz /metrics / /v1/nonces /v1/sign-in /v1/changes /v1/accounts/com.example.app/001.x; do
            c=$(code "$u$p"); c2=$(code -X POST -d x "$u$p")
            [[ $c == 404 && $c2 == 404 ]] && ok "$p not exposed (404)" || fail "$p: GET $c POST $c2"
        done
        head -c 70000 /dev/zero | tr '\0' a >"$tmp/big"
        c=$(code -X POST --data-binary @"$tmp/big" "$u/apple/notifications")
        [[ $c == 413 ]] && ok "70 000-byte body -> 413" || fail "big body: $c"
        [[ $(grep -c . "$tmp/seen") -eq 1 ]] && ok "only the one valid POST reached the upstream" || fail "upstream saw: $(cat "$tmp/seen")"
        for v in 1.2 1.3; do
            curl -sk -o /dev/null --tlsv$v --tls-max $v "$u/" && ok "TLS $v accepted" || fail "TLS $v refused"
        done
        # The client side allows TLS 1.1 (security level 0), so a refusal is the server's.
        if command -v openssl >/dev/null; then
            out=$(echo | timeout 5 openssl s_client -connect "127.0.0.1:$tls" -tls1_1 -cipher 'DEFAULT:@SECLEVEL=0' 2>&1)
            if grep -q 'Cipher is (NONE)' <<<"$out" && grep -q 'alert protocol version' <<<"$out"; then
                ok "TLS 1.1 refused by the server (protocol version alert)"
            else
                fail "TLS 1.1 not refused: $(grep -m1 -E 'Cipher is|error' <<<"$out")"
            fi
        fi
        grep -q 'a\.b\.c' "$n/log/siwa.access.log" && fail "access log holds the request body" \
            || { [[ -s $n/log/siwa.access.log ]] && ok "access log written, without bodies" || fail "access log empty"; }
    else
        fail "nginx did not start: $(cat "$n/start.err")"
    fi
else
    skip "nginx or openssl not available"
fi

# ---------------------------------------------------------------------------------------------
echo "== Kubernetes manifests (deploy/k8s)"
py=""
for p in python3 /usr/bin/python3; do command -v "$p" >/dev/null && "$p" -c 'import yaml' 2>/dev/null && { py=$p; break; }; done
if [[ -z $py ]]; then
    apt_install python3-yaml && /usr/bin/python3 -c 'import yaml' 2>/dev/null && py=/usr/bin/python3
fi
if [[ -z $py ]] && command -v python3 >/dev/null; then
    python3 -m pip install -q pyyaml >/dev/null 2>&1 && py=python3
fi
if [[ -n $py ]]; then
    "$py" - "$deploy/k8s" <<'EOF'
import os, sys, yaml
root = sys.argv[1]
passed = failed = 0
def check(cond, what):
    global passed, failed
    if cond: passed += 1; print("  ok    " + what)
    else: failed += 1; print("  FAIL  " + what)

docs = {}
for f in sorted(os.listdir(root)):
    if not f.endswith((".yaml", ".yml")): continue
    try:
        ds = [d for d in yaml.safe_load_all(open(os.path.join(root, f))) if d is not None]
        check(True, f"{f}: parses ({len(ds)} document(s))")
    except yaml.YAMLError as e:
        check(False, f"{f}: {e}"); continue
    docs[f] = ds

for f, ds in docs.items():
    for d in ds:
        if d.get("kind") == "Kustomization": continue
        check(isinstance(d.get("apiVersion"), str) and isinstance(d.get("kind"), str)
              and isinstance(d.get("metadata", {}).get("name"), str),
              f"{f}: {d.get('kind')} {d.get('metadata', {}).get('name')} has apiVersion, kind, metadata.name")

objs = {(d["kind"], d["metadata"]["name"]): d for f, ds in docs.items() if f != "secrets.example.yaml"
        for d in ds if d.get("kind") != "Kustomization"}
kust = docs.get("kustomization.yaml", [{}])[0]
listed = set(kust.get("resources", []))
manifests = {f for f in docs if f not in ("kustomization.yaml", "secrets.example.yaml")}
check(listed == manifests, f"kustomization lists every manifest: {sorted(listed)}")
check("secrets.example.yaml" not in listed, "example secrets are not in the kustomization")

def port_number(c, p):
    if isinstance(p, int): return p
    return next((x["containerPort"] for x in c.get("ports", []) if x.get("name") == p), None)

def pod_checks(name, spec, want_probe_port=None):
    pod = spec["template"]["spec"]
    psc = pod.get("securityContext", {})
    check(psc.get("runAsNonRoot") is True and psc.get("runAsUser", 0) != 0, f"{name}: pod runAsNonRoot, non-zero runAsUser")
    check(pod.get("automountServiceAccountToken") is False, f"{name}: no service account token")
    mounted_secret_vols = {v["name"] for v in pod.get("volumes", []) if "secret" in v}
    for c in pod["containers"]:
        sc = c.get("securityContext", {})
        check(sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True, f"{name}/{c['name']}: runAsNonRoot")
        check(sc.get("readOnlyRootFilesystem") is True, f"{name}/{c['name']}: readOnlyRootFilesystem")
        check(sc.get("allowPrivilegeEscalation") is False, f"{name}/{c['name']}: allowPrivilegeEscalation false")
        check(sc.get("capabilities", {}).get("drop") == ["ALL"], f"{name}/{c['name']}: drops ALL capabilities")
        r = c.get("resources", {})
        check(r.get("requests", {}).get("cpu") and r.get("requests", {}).get("memory") and r.get("limits", {}).get("memory"),
              f"{name}/{c['name']}: resources (cpu/memory requests, memory limit)")
        check(c.get("image") == "siwa", f"{name}/{c['name']}: image siwa (set by the kustomization)")
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        check("DATABASE_URL" not in env and "SIWA_TOKEN_KEYS" not in env, f"{name}/{c['name']}: no secret in env")
        mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
        for k, v in env.items():
            if k.endswith("_FILE"):
                m = next((m for p, m in mounts.items() if v.startswith(p.rstrip("/") + "/")), None)
                check(m is not None and m.get("readOnly") is True and m["name"] in mounted_secret_vols,
                      f"{name}/{c['name']}: {k} is in a read-only Secret volume")
        for ref in c.get("envFrom", []):
            cm = ref.get("configMapRef", {}).get("name")
            check(("ConfigMap", cm) in objs, f"{name}/{c['name']}: ConfigMap {cm} exists")
        if want_probe_port is not None:
            for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
                g = c.get(probe, {}).get("httpGet", {})
                check(g.get("path") == path and port_number(c, g.get("port")) == want_probe_port,
                      f"{name}/{c['name']}: {probe} GET {path} on {want_probe_port}")
    return pod

rec = objs.get(("Deployment", "siwa-receiver"))
wrk = objs.get(("Deployment", "siwa-worker"))
check(rec is not None and wrk is not None, "receiver and worker Deployments exist")
if rec:
    check(rec["spec"].get("replicas") == 2, "receiver: 2 replicas")
    check(rec["spec"]["selector"]["matchLabels"].items() <= rec["spec"]["template"]["metadata"]["labels"].items(),
          "receiver: selector matches its pod labels")
    pod = pod_checks("receiver", rec["spec"], 8080)
    labels = rec["spec"]["template"]["metadata"]["labels"]
    svc = objs.get(("Service", "siwa-receiver"))
    check(svc is not None and svc["spec"]["selector"].items() <= labels.items(), "Service selects the receiver pods")
    pdb = objs.get(("PodDisruptionBudget", "siwa-receiver"))
    check(pdb is not None and pdb["spec"].get("minAvailable") == 1
          and pdb["spec"]["selector"]["matchLabels"].items() <= labels.items(), "PDB minAvailable 1 on the receiver pods")
    c = pod["containers"][0]
    check(c.get("command") == ["siwa-receiver"], "receiver runs siwa-receiver")
    sec = {v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v}
    check(sec == {"siwa-receiver"}, "receiver mounts only its own Secret")
if wrk:
    pod = pod_checks("worker", wrk["spec"], 9090)
    c = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    check(env.get("SIWA_OPS_LISTEN") == "0.0.0.0:9090", "worker: SIWA_OPS_LISTEN=0.0.0.0:9090")
    check({"DATABASE_URL_FILE", "SIWA_PRIVATE_KEY_FILE", "SIWA_TOKEN_KEYS_FILE"} <= env.keys(), "worker: secrets through *_FILE")
    check(pod.get("terminationGracePeriodSeconds", 30) > 30, "worker: terminationGracePeriodSeconds above the 30 s grace")
    check(c.get("command") == ["siwa-worker"], "worker runs siwa-worker")
    if rec:
        check(wrk["spec"]["selector"]["matchLabels"] != rec["spec"]["selector"]["matchLabels"],
              "worker and receiver selectors differ (scaled independently)")
    check(env.get("SIWA_APP_API_TOKENS_FILE") is not None and "SIWA_APP_API_TOKENS" not in env,
          "worker: app API tokens through SIWA_APP_API_TOKENS_FILE")
api = objs.get(("Service", "siwa-app-api"))
check(api is not None and api["spec"].get("type", "ClusterIP") == "ClusterIP", "app API Service is internal (ClusterIP)")
check(not any(kind == "Ingress" for kind, _ in objs), "no Ingress (the app API is never exposed)")
check(all(o["spec"].get("type", "ClusterIP") == "ClusterIP" for (kind, _), o in objs.items() if kind == "Service"
          and o["metadata"]["name"] != "siwa-receiver"), "only the receiver's Service may be external")
job = objs.get(("Job", "siwa-migrate"))
check(job is not None, "migration Job exists")
if job:
    pod = pod_checks("migrate", job["spec"])
    check(pod["containers"][0].get("command") == ["siwa", "migrate"], "Job runs siwa migrate")
    check(pod.get("restartPolicy") in ("OnFailure", "Never"), "Job restartPolicy OnFailure/Never")
cm = objs.get(("ConfigMap", "siwa-config"))
check(cm is not None and not any(k in cm.get("data", {}) for k in ("DATABASE_URL", "SIWA_TOKEN_KEYS")),
      "ConfigMap holds no secret")
print(f"K8S {passed} {failed}")
sys.exit(1 if failed else 0)
EOF
    [[ $? -eq 0 ]] && ok "Kubernetes manifest checks" || fail "Kubernetes manifest checks (see above)"
else
    skip "no python3 with PyYAML"
fi
if command -v kubectl >/dev/null; then
    if out=$(kubectl kustomize "$deploy/k8s" 2>&1); then
        ok "kubectl kustomize builds ($(grep -c '^kind:' <<<"$out") objects; image $(grep -m1 'image:' <<<"$out" | awk '{print $2}'))"
    else
        fail "kubectl kustomize: $out"
    fi
else
    skip "kubectl not available: kustomization not built"
fi

# ---------------------------------------------------------------------------------------------
echo "== Dockerfile (deploy/docker/Dockerfile; not built: no Docker engine)"
df=$deploy/docker/Dockerfile
froms=$(grep -Ec '^FROM ' "$df")
[[ $froms -ge 2 ]] && ok "multi-stage ($froms FROM lines)" || fail "expected at least two stages"
grep -Eq '^FROM swift:6\.[1-9][0-9]*-bookworm AS build' "$df" && ok "build stage on swift:6.x-bookworm" || fail "build stage image"
last_from=$(grep -n '^FROM ' "$df" | tail -1 | cut -d: -f1)
tail -n +"$last_from" "$df" >"$tmp/final"
grep -Eq '^FROM debian:bookworm-slim' "$tmp/final" && ok "runtime stage on debian:bookworm-slim" || fail "runtime stage image"
user=$(grep -E '^USER ' "$tmp/final" | tail -1 | awk '{print $2}' | cut -d: -f1)
[[ -n $user && $user != 0 && $user != root ]] && ok "runtime USER $user (non-root)" || fail "runtime USER '$user'"
grep -q 'uid 10001' "$tmp/final" && ok "user uid 10001 created" || fail "uid 10001 not created"
grep -q 'swift build -c release --static-swift-stdlib' "$df" && ok "release build with static Swift stdlib" || fail "swift build flags"
for b in siwa-receiver siwa-worker siwa; do
    grep -q "\"\$bin/$b\"" "$df" || { fail "binary $b not copied"; continue; }
done
grep -q '^COPY --from=build /out/ /usr/local/bin/' "$tmp/final" && ok "three binaries copied to /usr/local/bin" || fail "binaries not copied"
pkgs=$(grep -o 'apt-get install [^&]*' "$tmp/final" | tr ' ' '\n' | grep -Ev '^(apt-get|install|-.*|\\)?$' | sort -u | tr '\n' ' ')
[[ $pkgs == "ca-certificates libcurl4 libmicrohttpd12 libpq5 libssl3 " ]] && ok "runtime packages: $pkgs" || fail "runtime packages: $pkgs"
grep -q '^CMD \["siwa-receiver"\]' "$tmp/final" && ! grep -q '^ENTRYPOINT' "$df" \
    && ok "default command siwa-receiver, no ENTRYPOINT (docker run IMAGE siwa-worker works)" || fail "CMD/ENTRYPOINT"
if [[ -f $repo/.dockerignore ]]; then
    ok ".dockerignore at the repository root"
    for p in Package.swift Sources/ Tests/ sql/; do
        grep -qx "!$p" "$repo/.dockerignore" || fail ".dockerignore does not re-include $p"
    done
else
    fail ".dockerignore missing at the repository root"
fi
while read -r src; do
    [[ -e $repo/$src ]] || fail "COPY source $src does not exist in the repository"
done < <(grep -E '^COPY [^-]' "$df" | awk '{for (i = 2; i < NF; i++) print $i}')

# ---------------------------------------------------------------------------------------------
echo "== monitoring (deploy/monitoring)"
mon=$deploy/monitoring
if ! command -v promtool >/dev/null; then apt_install prometheus || true; fi
if command -v promtool >/dev/null; then
    if out=$(promtool check rules "$mon/siwa-alerts.yml" 2>&1); then
        ok "promtool check rules siwa-alerts.yml ($(grep -o 'SUCCESS: [0-9]* rules found' <<<"$out"))"
    else
        fail "promtool check rules: $out"
    fi
else
    fail "promtool not found and could not be installed (Debian package prometheus)"
fi
# Every metric the rules and the dashboard name is one the code exports (a histogram's _bucket,
# _sum and _count included); `up` is Prometheus's own.
exported=$(grep -rhoE '"siwa_[a-z_]+"' "$repo/Sources" | tr -d '"' | sort -u)
if python3 - "$mon/siwa-alerts.yml" "$mon/siwa-dashboard.json" "$tmp/queries" <<'PY'
import json, re, sys
rules, dashboard, out = sys.argv[1:4]
queries = []
for line in open(rules):
    m = re.match(r"\s*expr:\s*(.+)", line)
    if m: queries.append(("siwa-alerts.yml", m.group(1)))
board = json.load(open(dashboard))  # fails on invalid JSON
assert board.get("panels"), "no panels"
for panel in board["panels"]:
    targets = panel.get("targets") or []
    assert targets, "panel %r has no query" % panel.get("title")
    for target in targets: queries.append(("panel " + panel["title"], target["expr"]))
with open(out, "w") as f:
    for where, expr in queries:
        names = set(re.findall(r"\bsiwa_[a-z0-9_]+", expr)) | ({"up"} if re.search(r"\bup\{", expr) else set())
        if not names: print("NONE\t%s" % where, file=f)
        for n in names: print("%s\t%s" % (n, where), file=f)
PY
then
    ok "siwa-dashboard.json is valid JSON with a query in every panel"
    unknown=()
    queried=0
    while IFS=$'\t' read -r name where; do
        queried=$((queried + 1))
        [[ $name == NONE ]] && { unknown+=("$where names no metric"); continue; }
        [[ $name == up ]] && continue
        base=$(sed -E 's/_(bucket|sum|count)$//' <<<"$name")
        grep -qx "$name" <<<"$exported" || grep -qx "$base" <<<"$exported" || unknown+=("$name ($where)")
    done <"$tmp/queries"
    [[ ${#unknown[@]} -eq 0 ]] && ok "every metric in the $queried rule and dashboard queries is exported by the code" \
        || fail "metrics not exported by the code: ${unknown[*]}"
else
    fail "siwa-dashboard.json: not valid, or a panel without a query"
fi
rows=$(awk '/^## What to alert on/{on=1; next} /^## /{on=0} on && /^\| / && !/^\| (signal|---)/' "$repo/deploy/README.md" | wc -l)
alerts=$(grep -c '^ *- alert:' "$mon/siwa-alerts.yml")
[[ $rows -gt 0 && $alerts -ge $rows ]] && ok "$alerts alert rules for deploy/README.md's $rows \"What to alert on\" rows" \
    || fail "$alerts alert rules for $rows \"What to alert on\" rows"

echo "== scripts"
for s in "$here"/*.sh; do bash -n "$s" && ok "bash -n $(basename "$s")" || fail "bash -n $(basename "$s")"; done

echo "deploy-check: $passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
