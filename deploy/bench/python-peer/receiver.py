"""The peer the receiver benchmark compares against: a competent Python receiver.

Pure ASGI under uvicorn, PyJWT verifying RS256 against the JWKS (fetched once, cached by kid),
psycopg 3 with a connection pool, one INSERT ... ON CONFLICT DO NOTHING per request into the same
siwa.notifications table (whose trigger queues the job), answering 200 after the commit.
Benchmark-only: started by deploy/bench/receiver.sh.
"""
import json
import os
import urllib.request

import jwt
from psycopg_pool import AsyncConnectionPool

APPLE_BASE = os.environ["SIWA_APPLE_BASE_URL"]
CLIENT_IDS = os.environ["SIWA_CLIENT_IDS"].split(",")
POOL = AsyncConnectionPool(os.environ["DATABASE_URL"], min_size=8, max_size=16, open=False)
KEYS = {}


def load_keys():
    with urllib.request.urlopen(APPLE_BASE + "/auth/keys", timeout=5) as response:
        for jwk in json.load(response)["keys"]:
            KEYS[jwk["kid"]] = jwt.algorithms.RSAAlgorithm.from_jwk(json.dumps(jwk))


INSERT = """
INSERT INTO siwa.notifications (jti, client_id, sub, event_type, event_time, email, claims, jws)
VALUES (%s, %s, %s, %s, to_timestamp(%s), %s, %s, %s) ON CONFLICT (jti) DO NOTHING
"""


async def read_body(receive):
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def reply(send, status, payload):
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": payload})


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                load_keys()
                await POOL.open()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await POOL.close()
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = await read_body(receive)
    try:
        token = json.loads(body)["payload"]
        kid = jwt.get_unverified_header(token)["kid"]
        claims = jwt.decode(token, KEYS[kid], algorithms=["RS256"], audience=CLIENT_IDS,
                            issuer="https://appleid.apple.com")
        events = claims["events"]
        event = json.loads(events) if isinstance(events, str) else events
    except Exception:
        await reply(send, 401, b'{"error":"invalid"}')
        return
    event_time = event["event_time"]
    if event_time >= 10**11:
        event_time = event_time / 1000
    async with POOL.connection() as connection:
        await connection.execute(INSERT, (claims["jti"], claims["aud"], event["sub"], event["type"], event_time,
                                          event.get("email"), json.dumps(claims), token))
    await reply(send, 200, b'{"status":"stored"}')
