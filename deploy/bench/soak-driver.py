#!/usr/bin/env python3
"""Soak traffic for deploy/bench/soak.sh: mixed notifications against a receiver for a while.

Kinds (by weight): valid (fresh jti, 70%), duplicate (a body already answered 200, 10%), forged
(Apple's kid, another key: 401, 10%), malformed (400, 10%). One deletion requested through
psql every second while it runs. Every 10 s prints throughput, p99 and the RSS of each process.
Writes the jtis answered 200 to OUT_DIR/accepted.txt and the deletions to OUT_DIR/deleted.txt.
"""
import base64, http.client, json, os, random, subprocess, sys, threading, time, uuid
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

port, seconds, kid, key_file, out_dir, psql_url = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
pids = dict(p.split("=") for p in sys.argv[7].split(","))
subs_to_delete = [s for s in open(os.path.join(out_dir, "linked.txt")).read().split() if s]
key = serialization.load_pem_private_key(open(key_file, "rb").read(), password=None)
forger = rsa.generate_private_key(public_exponent=65537, key_size=2048)

def b64(data): return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

def sign(claims, private_key):
    header = b64(json.dumps({"alg": "RS256", "kid": kid}).encode())
    payload = b64(json.dumps(claims).encode())
    signature = private_key.sign(f"{header}.{payload}".encode(), padding.PKCS1v15(), hashes.SHA256())
    return json.dumps({"payload": f"{header}.{payload}.{b64(signature)}"}).encode()

def claims(jti, sub):
    now = int(time.time())
    event = {"type": random.choice(["consent-revoked", "email-disabled", "email-enabled", "account-deleted"]),
             "sub": sub, "event_time": now * 1000, "email": "x@privaterelay.appleid.com", "is_private_email": "true"}
    return {"iss": "https://appleid.apple.com", "aud": "com.example.app", "iat": now, "exp": now + 86400,
            "jti": jti, "events": json.dumps(event)}

MALFORMED = [b"hello", b'{"token":"x"}', b'{"payload":42}', b'{"payload":"a.b"}', b'{"payload":"' + b"[" * 600 + b'"}', b"\xff\xfe{"]
lock = threading.Lock()
latencies, window, counts, accepted, accepted_bodies = [], [0], {}, [], []
deadline = time.monotonic() + seconds

def worker():
    connection = http.client.HTTPConnection("127.0.0.1", int(port), timeout=30)
    while time.monotonic() < deadline:
        roll = random.random()
        jti = None
        if roll < 0.7:
            kind, jti = "valid", "soak-" + uuid.uuid4().hex
            body = sign(claims(jti, "soak-sub-" + uuid.uuid4().hex[:12]), key)
        elif roll < 0.8 and accepted_bodies:
            kind, (jti, body) = "duplicate", random.choice(accepted_bodies)
        elif roll < 0.9:
            kind, body = "forged", sign(claims("forged-" + uuid.uuid4().hex, "x"), forger)
        else:
            kind, body = "malformed", random.choice(MALFORMED)
        started = time.monotonic()
        try:
            connection.request("POST", "/apple/notifications", body, {"Content-Type": "application/json"})
            response = connection.getresponse(); response.read(); status = response.status
        except Exception:
            connection.close(); connection = http.client.HTTPConnection("127.0.0.1", int(port), timeout=30); status = 0
        elapsed = time.monotonic() - started
        with lock:
            latencies.append(elapsed); window[0] += 1
            counts[(kind, status)] = counts.get((kind, status), 0) + 1
            if status == 200 and kind == "valid":
                accepted.append(jti)
                if len(accepted_bodies) < 5000: accepted_bodies.append((jti, body))

def deleter():
    index = 0
    while time.monotonic() < deadline and index < len(subs_to_delete):
        subprocess.run(["psql", "-X", "-q", "-At", psql_url, "-c",
                        f"SELECT siwa.request_deletion('com.example.app', '{subs_to_delete[index]}')"],
                       check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(out_dir, "deleted.txt"), "a") as f: f.write(subs_to_delete[index] + "\n")
        index += 1
        time.sleep(1)

def rss_mb(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS"): return f"{int(line.split()[1]) / 1024:.0f}"
    except OSError: return "gone"

threads = [threading.Thread(target=worker) for _ in range(int(os.environ.get("SOAK_CONNECTIONS", "16")))]
threads.append(threading.Thread(target=deleter))
for t in threads: t.start()
start = time.monotonic()
print(f"{'t s':>6} {'req/s':>8} {'p99 ms':>8}  " + "  ".join(f"{name} MB" for name in pids))
while any(t.is_alive() for t in threads[:-1]):
    time.sleep(10 if time.monotonic() + 10 < deadline else max(0.5, deadline - time.monotonic()))
    with lock:
        rate, window[0] = window[0] / 10, 0
        recent = sorted(latencies[-20000:])
    p99 = recent[int(len(recent) * 0.99) - 1] * 1000 if recent else 0
    print(f"{time.monotonic() - start:6.0f} {rate:8.0f} {p99:8.1f}  " + "  ".join(f"{rss_mb(pid):>{len(name) + 3}}" for name, pid in pids.items()), flush=True)
for t in threads: t.join()
total = sorted(latencies)
print(f"\nrequests {len(total)} in {seconds:.0f} s: {len(total) / seconds:.0f} req/s; "
      f"p50 {total[len(total) // 2] * 1000:.1f} ms, p99 {total[int(len(total) * 0.99) - 1] * 1000:.1f} ms, max {total[-1] * 1000:.0f} ms")
for (kind, status), n in sorted(counts.items()): print(f"  {kind:<10} {status}: {n}")
unexpected = {k: n for k, n in counts.items() if k[1] not in {"valid": (200,), "duplicate": (200,), "forged": (401,), "malformed": (400,)}[k[0]]}
with open(os.path.join(out_dir, "accepted.txt"), "w") as f: f.write("\n".join(accepted) + "\n")
if unexpected: print(f"UNEXPECTED answers: {unexpected}"); sys.exit(1)
