#!/usr/bin/env python3
"""Posts signed notifications to the receiver on a fixed schedule, for deploy/bench/worker.sh.

Body k (one per line of BODIES, `{"payload":"<JWS>"}`) is due at start + k / RATE; THREADS
keep-alive connections take the next due body, wait for its moment, post it. A body that cannot be
sent on time is sent late, never skipped, so the rate printed is the one the receiver really got.
Writes one line per body to OUT: jti, due, answered (epoch seconds), HTTP status.
Prints: sent, achieved rate, lateness p50/p99 (sent - due), answer latency p50/p99, non-200 count.

Usage: steady-driver.py URL BODIES RATE OUT [THREADS=64: enough that answers slower than THREADS/RATE still keep the rate]
"""
import base64, http.client, json, sys, threading, time
from urllib.parse import urlsplit


def jti_of(body: str) -> str:
    payload = json.loads(body)["payload"].split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["jti"]


def main():
    url, bodies_path, rate, out_path = urlsplit(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4]
    threads = int(sys.argv[5]) if len(sys.argv) > 5 else 64
    bodies = [line.rstrip("\n") for line in open(bodies_path) if line.strip()]
    jtis = [jti_of(b) for b in bodies]
    results = [None] * len(bodies)
    lock = threading.Lock()
    next_index = [0]
    start = time.time() + 0.5

    def run():
        connection = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
        while True:
            with lock:
                k = next_index[0]
                next_index[0] += 1
            if k >= len(bodies):
                break
            due = start + k / rate
            pause = due - time.time()
            if pause > 0:
                time.sleep(pause)
            sent = time.time()
            try:
                connection.request("POST", url.path, bodies[k], {"Content-Type": "application/json"})
                response = connection.getresponse()
                response.read()
                status = response.status
            except (OSError, http.client.HTTPException):
                connection.close()
                connection = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
                status = 0
            results[k] = (due, sent, time.time(), status)
        connection.close()

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()

    def pct(values, p):
        values = sorted(values)
        return values[min(len(values) - 1, int(p * len(values)))] if values else float("nan")

    with open(out_path, "w") as out:
        for jti, (due, _, answered, status) in zip(jtis, results):
            out.write(f"{jti}\t{due:.6f}\t{answered:.6f}\t{status}\n")
    first_due = results[0][0]
    last_answer = max(r[2] for r in results)
    late = [1000 * (r[1] - r[0]) for r in results]
    answer = [1000 * (r[2] - r[1]) for r in results]
    bad = sum(1 for r in results if r[3] != 200)
    print(f"{len(results)} {len(results) / (last_answer - first_due):.1f} {pct(late, 0.5):.2f} {pct(late, 0.99):.2f} "
          f"{pct(answer, 0.5):.2f} {pct(answer, 0.99):.2f} {bad}")


if __name__ == "__main__":
    main()
