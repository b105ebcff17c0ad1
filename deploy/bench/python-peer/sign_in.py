"""The peer deploy/bench/sign-in.sh compares the app API against: a competent Python back end doing
Sign in with Apple's sign-in by hand, the same checks in the same order.

POST /v1/nonces and POST /v1/sign-in behind the same bearer check; nonces in a table of their own,
consumed with one DELETE ... RETURNING; the identity token verified with PyJWT (RS256 pinned, Apple's
JWKS fetched once and cached by kid, iss, aud, exp) and its nonce claim compared with the SHA-256 of
the raw nonce; the code exchanged at once with requests (client_secret signed ES256 by PyJWT, 5 s
timeout), the exchange's id_token verified and its sub compared; the refresh token encrypted with
AES-GCM (cryptography) and the account written with psycopg 3 from a connection pool. A pre-forked,
threaded HTTP/1.1 server (one process per core). Benchmark-only: started by deploy/bench/sign-in.sh.
"""
import base64
import hashlib
import hmac
import http.server
import json
import os
import secrets
import socket
import threading
import time

import jwt
import requests
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from psycopg_pool import ConnectionPool

APPLE_BASE = os.environ["SIWA_APPLE_BASE_URL"]
CLIENT_IDS = os.environ["SIWA_CLIENT_IDS"].split(",")
TOKENS = [t.encode() for t in os.environ["SIWA_APP_API_TOKENS"].split(",")]
TEAM_ID = os.environ["SIWA_TEAM_ID"]
KEY_ID = os.environ["SIWA_KEY_ID"]
with open(os.environ["SIWA_PRIVATE_KEY_FILE"]) as f:
    PRIVATE_KEY = f.read()
TOKEN_KEY = AESGCM(base64.b64decode(os.environ["SIWA_TOKEN_KEYS"].split(",")[0].split(":", 1)[1]))
ISSUER = "https://appleid.apple.com"

SCHEMA = """
CREATE SCHEMA IF NOT EXISTS peer;
CREATE TABLE IF NOT EXISTS peer.nonces (nonce text PRIMARY KEY, expires_at timestamptz NOT NULL);
CREATE TABLE IF NOT EXISTS peer.accounts (
    client_id text, sub text, status text NOT NULL, email text, refresh_token_enc bytea,
    linked_at timestamptz, updated_at timestamptz, PRIMARY KEY (client_id, sub));
"""

KEYS = {}
KEYS_LOCK = threading.Lock()
local = threading.local()


def apple_key(kid):
    with KEYS_LOCK:
        if kid not in KEYS:
            for jwk in requests.get(APPLE_BASE + "/auth/keys", timeout=5).json()["keys"]:
                KEYS[jwk["kid"]] = jwt.algorithms.RSAAlgorithm.from_jwk(json.dumps(jwk))
        return KEYS.get(kid)


def verify(token, client_id):
    kid = jwt.get_unverified_header(token).get("kid")
    key = apple_key(kid)
    if key is None:
        raise jwt.InvalidTokenError("unknown kid")
    return jwt.decode(token, key, algorithms=["RS256"], audience=client_id, issuer=ISSUER, leeway=60)


def session():
    if not hasattr(local, "session"):
        local.session = requests.Session()
    return local.session


def exchange(code, client_id):
    now = int(time.time())
    secret = jwt.encode({"iss": TEAM_ID, "iat": now, "exp": now + 300, "aud": ISSUER, "sub": client_id},
                        PRIVATE_KEY, algorithm="ES256", headers={"kid": KEY_ID})
    return session().post(APPLE_BASE + "/auth/token", timeout=5, data={
        "client_id": client_id, "client_secret": secret, "code": code, "grant_type": "authorization_code"})


def sign_in(body, pool):
    client_id, token, nonce = body.get("client_id"), body.get("identity_token"), body.get("nonce")
    code = body.get("authorization_code")
    if not all(isinstance(v, str) and v for v in (client_id, token, nonce)):
        return 400, {"error": "bad_request"}
    with pool.connection() as db:
        if db.execute("DELETE FROM peer.nonces WHERE nonce = %s AND expires_at > now() RETURNING 1",
                      (nonce,)).fetchone() is None:
            return 401, {"error": "nonce_invalid"}
    if client_id not in CLIENT_IDS:
        return 401, {"error": "token_invalid"}
    try:
        claims = verify(token, client_id)
    except jwt.PyJWTError:
        return 401, {"error": "token_invalid"}
    expected = hashlib.sha256(nonce.encode()).hexdigest()
    if not hmac.compare_digest(str(claims.get("nonce", "")).encode(), expected.encode()):
        return 401, {"error": "token_invalid"}
    sub = claims["sub"]
    with pool.connection() as db:
        row = db.execute("SELECT status, refresh_token_enc IS NOT NULL FROM peer.accounts WHERE client_id = %s AND sub = %s",
                         (client_id, sub)).fetchone()
    if row and row[0] == "pending_deletion":
        return 403, {"error": "account_deleting"}
    sealed = None
    if not (row and row[1]) and code:
        try:
            answer = exchange(code, client_id)
        except requests.RequestException:
            return 502, {"error": "token_exchange_failed"}
        if answer.status_code == 400 and answer.json().get("error") == "invalid_grant":
            return 400, {"error": "code_invalid"}
        if answer.status_code != 200:
            return 502, {"error": "token_exchange_failed"}
        tokens = answer.json()
        try:
            if verify(tokens["id_token"], client_id)["sub"] != sub:
                return 400, {"error": "code_invalid"}
        except (jwt.PyJWTError, KeyError):
            return 400, {"error": "code_invalid"}
        iv = secrets.token_bytes(12)
        sealed = iv + TOKEN_KEY.encrypt(iv, tokens["refresh_token"].encode(), f"{client_id}\0{sub}".encode())
    with pool.connection() as db:
        new, has_token = db.execute(
            """INSERT INTO peer.accounts AS a (client_id, sub, status, email, refresh_token_enc, linked_at, updated_at)
               VALUES (%s, %s, 'active', %s, %s, now(), now())
               ON CONFLICT (client_id, sub) DO UPDATE SET status = 'active', email = coalesce(EXCLUDED.email, a.email),
                   refresh_token_enc = coalesce(a.refresh_token_enc, EXCLUDED.refresh_token_enc), updated_at = now()
               RETURNING xmax = 0, refresh_token_enc IS NOT NULL""",
            (client_id, sub, claims.get("email"), sealed)).fetchone()
    return 200, {"client_id": client_id, "sub": sub, "email": claims.get("email"),
                 "email_verified": str(claims.get("email_verified")).lower() == "true",
                 "is_private_email": str(claims.get("is_private_email")).lower() == "true",
                 "status": "active", "app_user_id": None, "new": new, "has_refresh_token": has_token}


def make_handler(pool):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # One send per answer, as a production server writes it: unbuffered (the default), the
        # headers and the body went out as two segments, and Nagle held the body until the driver's
        # delayed ACK of the headers (about 40 ms, every answer). handle_one_request flushes.
        wbufsize = -1

        def answer(self, status, obj):
            out = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
            auth = (self.headers.get("Authorization") or "").encode()
            if not auth.startswith(b"Bearer ") or not any(hmac.compare_digest(auth[7:], t) for t in TOKENS):
                return self.answer(401, {"error": "unauthorized"})
            if self.path == "/v1/nonces":
                nonce = secrets.token_urlsafe(32)
                with pool.connection() as db:
                    expires = db.execute("INSERT INTO peer.nonces VALUES (%s, now() + interval '5 minutes') RETURNING expires_at",
                                         (nonce,)).fetchone()[0]
                return self.answer(201, {"nonce": nonce, "expires_at": expires.isoformat()})
            if self.path == "/v1/sign-in":
                try:
                    parsed = json.loads(body)
                except ValueError:
                    return self.answer(400, {"error": "bad_request"})
                return self.answer(*sign_in(parsed if isinstance(parsed, dict) else {}, pool))
            return self.answer(404, {"error": "not_found"})

        def log_message(self, *args):
            pass

    return Handler


def main():
    port = int(os.environ["PORT"])
    with ConnectionPool(os.environ["DATABASE_URL"], min_size=1, max_size=1) as setup:
        with setup.connection() as db:
            db.execute(SCHEMA)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # As gunicorn sets it on its listeners (accepted sockets inherit it on Linux).
    listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(256)
    for _ in range(int(os.environ.get("PROCESSES", "2")) - 1):
        if os.fork() == 0:
            break
    pool = ConnectionPool(os.environ["DATABASE_URL"], min_size=4, max_size=16)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), make_handler(pool), bind_and_activate=False)
    server.socket = listener
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
