"""W3-style start latency behind a transaction pooler (issue 24, point 5; docs/pooling.md).

    .venv/bin/python -m tests.bench.bench_pooling

The peer benchmark's W3 (500 jobs/s for 10 s through the SQL door, each due now; latency =
handler start - due time, one wall clock) for one daemon, in three set-ups on fresh databases:
straight to PostgreSQL with LISTEN (the default), and through a real PgBouncer in transaction
mode (the Debian package's binary, started by tests/pgbouncer.py) with `database.wakeups =
"poll"` at two poll intervals. The jobs are enqueued through the same URL as the daemon's.
`BENCH_POOLING_RATE` and `BENCH_POOLING_SECONDS` change the pace and the length.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg

from tests.bench.bench_engine import ENGINE_ENV, paced_enqueue
from tests.bench.common import (
    Bench,
    Figure,
    daemon,
    environment_only,
    percentile,
    register_handler,
    run,
    wait_for,
)
from tests.bench.peers.run import Records
from tests.pgbouncer import binary, pgbouncer

WARMUP_JOBS = 20
SETUPS = [
    ("direct, listen", False, {}),
    (
        "PgBouncer transaction, poll 0.05 s",
        True,
        {"DISPATCHER_DATABASE__WAKEUPS": "poll", "DISPATCHER_DATABASE__POLL_INTERVAL_S": "0.05"},
    ),
    ("PgBouncer transaction, poll 0.25 s", True, {"DISPATCHER_DATABASE__WAKEUPS": "poll"}),
]


@contextlib.asynccontextmanager
async def url_for(bench: Bench, dsn: str, pooled: bool) -> AsyncIterator[str]:
    if not pooled:
        yield dsn
        return
    async with pgbouncer(bench.server.url, dsn.rsplit("/", 1)[1]) as url:
        yield url


async def unfinished(conn: asyncpg.Connection) -> int:
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM dispatcher.jobs WHERE state NOT IN ('succeeded', 'dead')"
        )
    )


async def latency_run(bench: Bench, pooled: bool, extra: dict[str, str]) -> list[float]:
    rate = int(os.environ.get("BENCH_POOLING_RATE", "500"))
    n = round(rate * float(os.environ.get("BENCH_POOLING_SECONDS", "10")))
    record = Path(tempfile.mkstemp(prefix="pooling-", suffix=".json")[1])
    env = {
        **ENGINE_ENV,
        "DISPATCHER_HANDLERS__NOOP__FUNCTION": "tests.bench.peers.handlers:record",
        "PEERS_RECORD_FILE": str(record),
        **extra,
    }
    async with bench.server.database() as dsn, url_for(bench, dsn, pooled) as url:
        await register_handler(dsn, "noop")
        pool = await asyncpg.create_pool(url, min_size=8, max_size=8, statement_cache_size=0)
        assert pool is not None
        checker = await asyncpg.connect(url, statement_cache_size=0)
        try:
            async with daemon(url, env):
                for i in range(WARMUP_JOBS):
                    await pool.execute("SELECT dispatcher.enqueue($1, 'noop')", f"warm-{i}")

                async def done() -> bool:
                    return await unfinished(checker) == 0

                await wait_for(done, 60, what="the warm-up jobs")
                t0 = time.time()
                await paced_enqueue(pool, n, rate)
                await wait_for(done, 120, what="the paced jobs")
        finally:
            await checker.close()
            await pool.close()
    records = Records.load(record)
    os.unlink(record)
    latencies = [
        (s - r) * 1000
        for s, r in zip(records.starts, records.refs, strict=True)
        if r is not None and r >= t0
    ]
    if len(latencies) < n:
        raise RuntimeError(f"only {len(latencies)} of {n} start times recorded")
    return latencies


async def main() -> None:
    bench = await Bench("bench_pooling").open()
    if binary() is None:
        print("pgbouncer is not installed (Debian: apt-get install pgbouncer): direct run only")
    for name, pooled, extra in SETUPS:
        if pooled and binary() is None:
            continue
        latencies = await latency_run(bench, pooled, extra)
        figures = {f"p{q}": percentile(latencies, q / 100) for q in (50, 95, 99)}
        bench.details[name] = figures
        for label, value in figures.items():
            bench.add(Figure(f"W3 start latency {label}, {name}", value, "ms"))
    bench.finish("start latency behind a transaction pooler")


if __name__ == "__main__":
    environment_only(__doc__)
    run(main)
