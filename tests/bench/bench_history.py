"""What the cluster-wide history costs (issue 26, point 1), beside the drain itself (measured
with and without by bench_engine --only drain on this branch and on the commit before it):

- a flush's CPU in the daemon: reading the metric registry and taking the differences, with
  `--queues` queues that all started work (the recorder's `run_once` without its statement);
- a flush's statement: `history_add` of `--queues` queues and '*', three writers at once, all on
  the same minute's rows (the contended case: three daemons flushing together);
- the console's reads on a week of minutes of `--queues` queues and '*': the 7-day chart of one
  queue (84 steps), the 24-hour overview chart (96 steps), the overview's recent starts.

    .venv/bin/python -m tests.bench.bench_history [--queues 20] [--flushes 200]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from datetime import UTC, datetime

import asyncpg

from dispatcher.db.history import ALL_QUEUES, Counts, HistoryStore
from dispatcher.db.pool import _init_connection
from dispatcher.engine.history import difference, read_metrics, with_total
from dispatcher.observability import metrics
from dispatcher.operator.history import RANGES, read_history
from tests.bench.common import Bench, Figure, percentile, run


def flush_cpu_us(queues: list[str], rounds: int) -> float:
    """Median microseconds of one reading and its differences, with every queue active."""
    for q in queues:
        metrics.DUE_TO_START.labels(q).observe(0.01)
        metrics.JOBS_COMPLETED.labels(q, "succeeded").inc()
        metrics.RETRIES.labels(q, "http_5xx").inc()
    last = read_metrics()
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        reading = read_metrics()
        with_total({q: difference(r, last.get(q)) for q, r in reading.items()})
        samples.append((time.perf_counter() - started) * 1e6)
        last = reading
    return statistics.median(samples)


async def flush_ms(pool: asyncpg.Pool, queues: list[str], flushes: int) -> list[float]:
    """Milliseconds per `history_add`, three writers at once on the same rows."""
    counts = with_total({q: Counts(100, 95, 3, 2, (40, 50, 10)) for q in queues})
    store, samples = HistoryStore(pool), []

    async def writer() -> None:
        for _ in range(flushes):
            started = time.perf_counter()
            await store.add(counts)
            samples.append((time.perf_counter() - started) * 1000)

    await asyncio.gather(writer(), writer(), writer())
    return samples


async def read_ms(pool: asyncpg.Pool, queue: str, range_name: str, reads: int) -> float:
    store, samples = HistoryStore(pool), []
    for _ in range(reads):
        started = time.perf_counter()
        await read_history(store, queue, RANGES[range_name], datetime.now(UTC))
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


async def main(args: argparse.Namespace) -> None:
    bench = await Bench("bench_history").open()
    queues = [f"q{i:02d}" for i in range(args.queues)]
    bench.add(
        Figure(
            f"flush CPU (read metrics + differences), {args.queues} active queues",
            flush_cpu_us(queues, 2000),
            "us",
        )
    )
    async with bench.server.database() as dsn:
        pool = await asyncpg.create_pool(dsn, min_size=3, max_size=3, init=_init_connection)
        assert pool is not None
        samples = await flush_ms(pool, queues, args.flushes)
        bench.add(
            Figure(
                f"flush statement, {args.queues} queues + '*', 3 writers on the same rows",
                statistics.median(samples),
                "ms",
                note=f"p95 {percentile(samples, 0.95):.2f} ms",
            )
        )
        await pool.execute("TRUNCATE dispatcher.history")
        await pool.execute(
            """INSERT INTO dispatcher.history (queue, minute, started, succeeded, latency)
               SELECT q, date_trunc('minute', now()) - make_interval(mins => g), 10, 10,
                      '{1, 2, 3, 4}'
                 FROM generate_series(0, 7 * 1440 - 1) g, unnest($1::text[]) q""",
            [*queues, ALL_QUEUES],
        )
        await pool.execute("VACUUM ANALYZE dispatcher.history")
        rows = await pool.fetchval("SELECT count(*) FROM dispatcher.history")
        size = await pool.fetchval("SELECT pg_total_relation_size('dispatcher.history')")
        bench.add(Figure(f"a week of history, {rows:,} rows", size / 1e6, "MB"))
        bench.add(Figure("7-day chart of one queue", await read_ms(pool, "q01", "7d", 20), "ms"))
        bench.add(Figure("24-hour chart of all queues", await read_ms(pool, "*", "24h", 20), "ms"))
        store = HistoryStore(pool)
        started = time.perf_counter()
        for _ in range(20):
            await store.recent_starts_per_s()
        bench.add(
            Figure("overview's recent starts", (time.perf_counter() - started) / 20 * 1000, "ms")
        )
        await pool.close()
    bench.finish("history")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", type=int, default=20)
    parser.add_argument("--flushes", type=int, default=200, help="per writer")
    run(lambda: main(parser.parse_args()))
