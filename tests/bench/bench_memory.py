"""Memory: the daemon's peak resident set (VmHWM) while it drains large payloads and while it
answers status reads of a large job (issue 20, defect 3; docs/memory.md).

  (a) drain: N jobs of S MB each (SQL door, `http` handler, payloads built in the server),
      stored with the queue paused, then released at once to a loopback target in its own
      process; peak RSS, drain rate and MB/s. The issue's reproductions: 2,000 x 3 MB
      (1,221 MB before the budget) and 300 x 10 MB (3,032 MB).
  (b) reads: 8 clients read GET /v1/jobs/{id} of a job with a 30 MB payload, R rounds each
      (233 MB for one read and 956 MB for 8 at once before).

Each workload runs with each budget given (`--budgets`, MiB; the default is the daemon's, 64).

    .venv/bin/python -m tests.bench.bench_memory [--drains 2000x3,300x10] [--budgets 64,32]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import aiohttp
import asyncpg

from tests.bench.common import (
    LOOPBACK_HTTP_ENV,
    Bench,
    Figure,
    daemon,
    peak_rss_mb,
    run,
    target_process,
    wait_for,
)

RSS_BOUND_MB = 250  # DESIGN.md, invariant 8
MB = 1_000_000
PAUSE = "UPDATE dispatcher.queues SET paused = true, paused_at = now() WHERE name = 'default'"
RESUME = "UPDATE dispatcher.queues SET paused = false, paused_at = NULL WHERE name = 'default'"
ENQUEUE = """
SELECT count(*) FROM dispatcher.enqueue_many(
       (SELECT array_agg($1 || g) FROM generate_series(1, $2) g),
       array_fill('http'::text, ARRAY[$2]),
       (SELECT array_agg(jsonb_build_object('n', g, 'blob', repeat('x', $3)))
          FROM generate_series(1, $2) g),
       targets => array_fill(jsonb_build_object('url', $4::text), ARRAY[$2]))
"""
LEFT = "SELECT count(*) FROM dispatcher.job_state WHERE state NOT IN ('succeeded', 'dead')"


def budget_env(budget_mib: int) -> dict[str, str]:
    return {
        **LOOPBACK_HTTP_ENV,
        "DISPATCHER_MAX_INFLIGHT_PAYLOAD_BYTES": str(budget_mib * 1024 * 1024),
        "DISPATCHER_SCAN_INTERVAL_S": "0.2",
    }


async def drain(bench: Bench, jobs: int, size_mb: int, budget_mib: int) -> None:
    async with bench.server.database() as dsn, target_process() as (url, _pid):
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(PAUSE)
            for start in range(0, jobs, 100):  # 100 per statement: bounded server memory
                await conn.fetchval(
                    ENQUEUE, f"d{start}-", min(100, jobs - start), size_mb * MB, url
                )
            async with daemon(dsn, budget_env(budget_mib)) as d:
                assert d.proc is not None
                idle = peak_rss_mb(d.proc.pid)
                started = time.monotonic()
                await conn.execute(RESUME)

                async def done() -> bool:
                    return int(await conn.fetchval(LEFT)) == 0

                await wait_for(done, 3600, interval_s=0.2, what="drain")
                elapsed = time.monotonic() - started
                peak = peak_rss_mb(d.proc.pid)
            states = await conn.fetch(
                "SELECT state, count(*)::int AS n FROM dispatcher.job_state GROUP BY state"
            )
        finally:
            await conn.close()
    bench.details[f"drain_{jobs}x{size_mb}_{budget_mib}"] = {
        "idle_mb": idle,
        "peak_mb": peak,
        "seconds": elapsed,
        "states": {r["state"]: r["n"] for r in states},
    }
    bench.add(
        Figure(
            f"drain {jobs:,} x {size_mb} MB (budget {budget_mib} MiB): peak RSS",
            peak,
            "MiB",
            at_most=RSS_BOUND_MB,
            note=f"idle {idle:.0f} MiB; {jobs / elapsed:,.1f} jobs/s, "
            f"{jobs * size_mb / elapsed:,.0f} MB/s; states {dict(states)}",
        )
    )


async def reads(bench: Bench, rounds: int, budget_mib: int) -> None:
    async with bench.server.database() as dsn:
        conn = await asyncpg.connect(dsn)
        try:
            job_id = await conn.fetchval(
                "SELECT dispatcher.enqueue('huge', 'http',"
                " jsonb_build_object('blob', repeat('r', 30000000)),"
                " due_at => now() + interval '1 day',"
                ' target => \'{"url": "http://127.0.0.1:9/hook"}\')'
            )
        finally:
            await conn.close()
        async with daemon(dsn, budget_env(budget_mib)) as d, aiohttp.ClientSession() as s:
            assert d.proc is not None
            idle = peak_rss_mb(d.proc.pid)

            async def client() -> int:
                answered = 0
                for _ in range(rounds):
                    async with s.get(f"{d.base_url}/v1/jobs/{job_id}") as r:
                        assert r.status == 200, await r.text()
                        answered = len(await r.read())
                return answered

            started = time.monotonic()
            sizes = await asyncio.gather(*(client() for _ in range(8)))
            elapsed = time.monotonic() - started
            peak = peak_rss_mb(d.proc.pid)
    bench.add(
        Figure(
            f"8 clients x {rounds} status reads of a 30 MB job: peak RSS",
            peak,
            "MiB",
            at_most=RSS_BOUND_MB,
            note=f"idle {idle:.0f} MiB; {8 * rounds / elapsed:,.0f} reads/s; "
            f"{max(sizes)} bytes answered",
        )
    )


async def main(args: argparse.Namespace) -> None:
    bench = await Bench("bench_memory").open()
    for budget in args.budgets:
        for jobs, size_mb in args.drains:
            await drain(bench, jobs, size_mb, budget)
        await reads(bench, args.rounds, budget)
    bench.finish("memory")


def drains(text: str) -> list[tuple[int, int]]:
    pairs = [part.split("x") for part in text.split(",") if part]
    return [(int(n), int(size)) for n, size in pairs]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--drains", type=drains, default=drains("2000x3,300x10"), help="JOBSxMB, comma-separated"
    )
    parser.add_argument(
        "--budgets",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[64],
        help="max_inflight_payload_bytes in MiB, comma-separated",
    )
    parser.add_argument("--rounds", type=int, default=10, help="status reads per client")
    run(lambda: main(parser.parse_args()))
