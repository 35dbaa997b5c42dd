"""Priorities and tenant turns (issue 22; migration 023): the W2 drain of bench_engine (20,000
due no-op jobs waiting before the daemon starts, the queue's limits raised so they never bind)
with four shapes of the same jobs, run alternately in each round so the shared machine's
noise falls on all alike:

  plain         every job at priority 0, no tenant (today's W2)
  10 levels     priorities spread over 10 values (-50, -40, ..., 40), one tenant
  10k tenants   every job at priority 0, spread over 10,000 tenants (two jobs each)
  plain, 10-way every job at priority 0, no tenant, due times spread so the drain takes every
                tenth job as 10 levels does (the control: no priorities, the same order)

Each job carries its priority, tenant and due time from intake (the SQL door's batch). A
shaped drain takes its jobs in another order than they were written: 10 levels takes every
tenth row, so each page of the tables and indexes is changed by ten claims instead of one. That
costs PostgreSQL time whatever decides the order; the control pays it with plain's statements,
so 10 levels against the control is the cost of priorities alone. (Until 2026-12-05 the shapes
were made by rewriting every row after intake.)

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

from tests.bench.bench_engine import ENGINE_ENV, VACUUM, wait_terminal
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

# Each shape: the SQL of a job's tenant, priority and how long before now it was due, from its
# number g (1, 2, ...).
SHAPES = {
    "plain": ("''", "0", "0"),
    "10 levels": ("''", "(g % 10) * 10 - 50", "0"),
    "10k tenants": ("'t' || (g % 10000)", "0", "0"),
    "plain, 10-way": ("''", "0", "10 - g % 10"),  # g % 10 = 0 first, as priority -50
}
CONTROL = "plain, 10-way"
ENQUEUE_SHAPED = """
SELECT count(*)
  FROM (SELECT array_agg('drain-' || g ORDER BY g) AS k, array_agg('noop'::text) AS h,
               array_agg(jsonb_build_object('n', g) ORDER BY g) AS p,
               array_agg(({tenant})::text ORDER BY g) AS t,
               array_agg(({priority})::int ORDER BY g) AS r,
               array_agg(now() - make_interval(secs => ({due_back}) / 1000.0) ORDER BY g) AS d
          FROM generate_series($1::int, $2) g) a
 CROSS JOIN LATERAL dispatcher.enqueue_many(a.k, a.h, a.p, due_ats => a.d, tenants => a.t,
                                            priorities => a.r)
"""


async def enqueue_shaped(conn: asyncpg.Connection, jobs: int, shape: tuple[str, str, str]) -> None:
    tenant, priority, due_back_ms = shape
    sql = ENQUEUE_SHAPED.format(tenant=tenant, priority=priority, due_back=due_back_ms)
    for first in range(1, jobs + 1, 10_000):  # the SQL door's batches of 10,000, as W2's
        await conn.fetchval(sql, first, min(first + 9_999, jobs))


async def drain_once(server: Any, jobs: int, shape: tuple[str, str, str]) -> dict[str, Any]:
    async with contextlib.AsyncExitStack() as stack:
        dsn = await stack.enter_async_context(server.database())
        await register_handler(dsn, "noop")
        conn = await asyncpg.connect(dsn)
        try:
            await enqueue_shaped(conn, jobs, shape)
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
    control = statistics.median(x["rate"] for x in rounds[CONTROL])
    for name, runs in rounds.items():
        rate = statistics.median(x["rate"] for x in runs)
        rates = ", ".join(f"{x['rate']:,.0f}" for x in runs)
        cpu = statistics.median(x["postgres_us_per_job"] for x in runs)
        shaped = name not in ("plain", CONTROL)
        bench.add(
            Figure(
                f"W2 drain {args.jobs:,} no-op jobs, {name}",
                rate,
                "jobs/s",
                at_least=0.9 * plain if shaped else None,
                note=f"{rate / plain:.0%} of plain"
                + (f", {rate / control:.0%} of the 10-way control" if shaped else "")
                + f"; rounds {rates}; postgres {cpu:.0f} us/job",
            )
        )
    bench.details["rounds"] = rounds
    bench.finish("priorities and tenant turns (W2 drain)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per drain")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the four shapes")
    run(lambda: main(parser.parse_args()))
