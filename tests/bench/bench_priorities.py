"""Priorities and tenant turns (issue 22; migration 023): the W2 drain of bench_engine (20,000
due no-op jobs waiting before the daemon starts, the queue's limits raised so they never bind)
with three shapes of the same jobs, run alternately in each round so the shared machine's
noise falls on all three alike:

  plain         every job at priority 0, no tenant (today's W2)
  10 levels     priorities spread over 10 values (-50, -40, ..., 40), one tenant
  10k tenants   every job at priority 0, spread over 10,000 tenants (two jobs each)

The goal: each shape within 10 % of the plain drain of the same run. Rates are jobs /
(last finished_at - first started_at), on the database clock; the median round is reported.

    .venv/bin/python -m tests.bench.bench_priorities [--jobs 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from typing import Any

import asyncpg

from tests.bench.bench_engine import ENGINE_ENV, VACUUM, enqueue_bulk, wait_terminal
from tests.bench.common import (
    Bench,
    CpuMeter,
    Figure,
    daemon,
    db_name,
    register_handler,
    run,
    wait_for_quiet,
)

# Each shape rewrites the waiting jobs before the daemon starts (not timed), in both tables.
SHAPES = {
    "plain": None,
    "10 levels": "priority = (id % 10)::smallint * 10 - 50",
    "10k tenants": "tenant = 't' || (id % 10000)",
}


async def drain_once(server: Any, jobs: int, shape: str | None) -> dict[str, Any]:
    async with contextlib.AsyncExitStack() as stack:
        dsn = await stack.enter_async_context(server.database())
        await register_handler(dsn, "noop")
        conn = await asyncpg.connect(dsn)
        try:
            await enqueue_bulk(conn, "drain", jobs)
            if shape is not None:
                await conn.execute(f"UPDATE dispatcher.intents SET {shape}")
                await conn.execute(f"UPDATE dispatcher.job_state SET {shape}")
            await conn.execute(VACUUM)
            await wait_for_quiet(30)
            async with daemon(dsn, ENGINE_ENV, wait_ready=False) as d:
                assert d.proc is not None
                async with CpuMeter({"daemon": d.proc.pid}, db_name(dsn)) as cpu:
                    await wait_terminal(conn, jobs, 300, f"{jobs} jobs to finish")
            span = await conn.fetchval(
                "SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8"
                " FROM dispatcher.jobs"
            )
        finally:
            await conn.close()
    return {
        "rate": jobs / span,
        "daemon_us_per_job": cpu.cpu_s("daemon") / jobs * 1e6,
        "postgres_us_per_job": cpu.cpu_s("postgres") / jobs * 1e6,
    }


async def main(args: argparse.Namespace) -> None:
    bench = await Bench("bench_priorities").open()
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in SHAPES}
    for r in range(args.rounds):
        for name, shape in SHAPES.items():  # alternating: every round runs every shape
            result = await drain_once(bench.server, args.jobs, shape)
            rounds[name].append(result)
            print(f"    round {r + 1} {name}: {result['rate']:,.0f} jobs/s", flush=True)
    plain = statistics.median(x["rate"] for x in rounds["plain"])
    for name, runs in rounds.items():
        rate = statistics.median(x["rate"] for x in runs)
        rates = ", ".join(f"{x['rate']:,.0f}" for x in runs)
        cpu = statistics.median(x["postgres_us_per_job"] for x in runs)
        bench.add(
            Figure(
                f"W2 drain {args.jobs:,} no-op jobs, {name}",
                rate,
                "jobs/s",
                at_least=None if name == "plain" else 0.9 * plain,
                note=f"{rate / plain:.0%} of plain; rounds {rates}; postgres {cpu:.0f} us/job",
            )
        )
    bench.details["rounds"] = rounds
    bench.finish("priorities and tenant turns (W2 drain)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per drain")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three shapes")
    run(lambda: main(parser.parse_args()))
