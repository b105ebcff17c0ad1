#!/usr/bin/env python3
"""Signed notification rows for deploy/bench/worker.sh, shaped as the receiver stores them.

The bench stores them with a siwa_receiver login, so the trigger holds their jobs and the worker
verifies each stored jws against the fake Apple's key and its columns against the claims before
applying it: the production path after the receiver (StoredNotificationGate). Signing is done once
per key and shape and cached (RSA signing costs about a millisecond each).

Usage: sign-held.py KEY_PEM KID MIX COUNT OUT.csv
  MIX a: COUNT notifications, sub new-<i>, the four types in turn;
      b: the same for sub linked-<i> (accounts the bench links before, at 2025-12-01);
      c: COUNT/100 accounts hot-<i>, 100 email events each; part k (0..99) holds event
         (k*37 + i*11) % 100 of every account, so each account's events arrive out of order.
Columns: part, jti, client_id, sub, event_type, event_time_ms, email, is_private_email, claims, jws.
"""
import base64, csv, json, os, sys
from concurrent.futures import ProcessPoolExecutor
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding

CLIENT_ID = "com.example.app"
BASE_MS = 1767225600000  # 2026-01-01T00:00:00Z: after the linked accounts' linked_at
TYPES = ["email-enabled", "email-disabled", "consent-revoked", "account-deleted"]


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def rows(mix: str, count: int):
    if mix in ("a", "b"):
        prefix = "new-" if mix == "a" else "linked-"
        for i in range(1, count + 1):
            yield 0, f"{mix}{i}", prefix + str(i), TYPES[i % 4], BASE_MS + i, i
    elif mix == "c":
        accounts = count // 100
        for k in range(100):
            for i in range(1, accounts + 1):
                p = (k * 37 + i * 11) % 100
                kind = "email-enabled" if p % 2 == 0 else "email-disabled"
                yield k, f"c{k}-{i}", f"hot-{i}", kind, BASE_MS + p * 1000, i
    else:
        raise SystemExit(f"sign-held.py: unknown mix {mix}")


def sign_slice(args):
    pem, kid, items = args
    key = serialization.load_pem_private_key(pem, password=None)
    header = b64(json.dumps({"alg": "RS256", "kid": kid}, separators=(",", ":")).encode())
    out = []
    for part, jti, sub, kind, event_ms, i in items:
        event = {"type": kind, "sub": sub, "event_time": event_ms}
        email = private = ""
        if kind.startswith("email-"):
            email, private = f"u{i}@privaterelay.appleid.com", "t"
            event.update(email=email, is_private_email="true")
        claims = json.dumps({"iss": "https://appleid.apple.com", "aud": CLIENT_ID, "iat": 1767225600,
                             "exp": 1767312000, "jti": jti, "events": json.dumps(event, separators=(",", ":"))},
                            separators=(",", ":"))
        signing_input = f"{header}.{b64(claims.encode())}"
        signature = key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        out.append([part, jti, CLIENT_ID, sub, kind, event_ms, email, private, claims, f"{signing_input}.{b64(signature)}"])
    return out


def main():
    pem_path, kid, mix, count, output = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    pem = open(pem_path, "rb").read()
    items = list(rows(mix, count))
    workers = os.cpu_count() or 1
    slices = [(pem, kid, items[s::workers]) for s in range(workers)]
    with ProcessPoolExecutor(workers) as pool:
        signed = list(pool.map(sign_slice, slices))
    with open(output + ".tmp", "w", newline="") as f:
        writer = csv.writer(f)
        for index in range(len(items)):  # back into the order of `rows`
            writer.writerow(signed[index % workers][index // workers])
    os.replace(output + ".tmp", output)


if __name__ == "__main__":
    main()
