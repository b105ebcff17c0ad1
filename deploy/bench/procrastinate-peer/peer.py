"""The procrastinate peer of deploy/bench/worker.sh: the same effect write as the raw peer (one
UPDATE of a siwa.notifications row per job), run by procrastinate's worker.

    PYTHONPATH=. PEER_DATABASE_URL=... python -c 'import peer; peer.defer(N)'   # N jobs, jti b1..bN
    PYTHONPATH=. PEER_DATABASE_URL=... procrastinate --app peer.app worker --concurrency C
"""
import os
import sys

from procrastinate import App, PsycopgConnector

app = App(connector=PsycopgConnector(conninfo=os.environ["PEER_DATABASE_URL"]))


@app.task(name="apply", pass_context=True)
async def apply(context, jti: str) -> None:
    await context.app.connector.execute_query_async(
        "UPDATE siwa.notifications SET processed_at = now(), outcome = 'applied' WHERE jti = %(jti)s",
        jti=jti,
    )


def defer(count: int) -> None:
    with app.open():
        for start in range(1, count + 1, 5000):
            apply.batch_defer(*({"jti": f"b{i}"} for i in range(start, min(start + 5000, count + 1))))
