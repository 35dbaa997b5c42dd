"""What per-key limits cost a drain that they do not bind (issue 22 point 4): the W2 drain of
no-op jobs spread over 100 tenants (so 100 concurrency keys), once with the queue's plain limits
and once with key limits set high enough never to bind, yet below the queue's own (so none is
skipped as implied by them): key_max_inflight 1,000 (the queue runs 2,000; a key ~20),
key_rate_per_s 100,000, key_burst 10,000. Every claim then looks for keys at their cap, locks
its keys' rows and takes their tokens. Alternating plain / keyed, so both see the same noise.
The goal is within 10 % of the plain drain. Rates come from the database clock (last
finished_at - first started_at).

    .venv/bin/python -m tests.bench.bench_key_limits [--jobs 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from typing import Any

import asyncpg

from tests.bench.bench_engine import ENGINE_ENV, VACUUM, wait_terminal
from tests.bench.common import Bench, Figure, daemon, register_handler, run, wait_for_quiet

TENANTS = 100
KEYED_ENV = {
    "DISPATCHER_QUEUES__DEFAULT__KEY_MAX_INFLIGHT": "1000",
    "DISPATCHER_QUEUES__DEFAULT__KEY_RATE_PER_S": "100000",
    "DISPATCHER_QUEUES__DEFAULT__KEY_BURST": "10000",
}
# n no-op jobs over TENANTS tenants (the default concurrency key), due now, in one statement
ENQUEUE_TENANTS = """
SELECT count(*) FROM dispatcher.enqueue_many(
       (SELECT array_agg($1 || g) FROM generate_series(1, $2) g),
       array_fill('noop'::text, ARRAY[$2]),
       (SELECT array_agg(jsonb_build_object('n', g)) FROM generate_series(1, $2) g),
       NULL, NULL,
       (SELECT array_agg('tenant-' || (g % $3)) FROM generate_series(1, $2) g))
"""


async def drain_once(server: Any, jobs: int, keyed: bool) -> float:
    """One drain of `jobs` waiting before the daemon starts; jobs/s on the database clock."""
    async with contextlib.AsyncExitStack() as stack:
        dsn = await stack.enter_async_context(server.database())
        await register_handler(dsn, "noop")
        conn = await asyncpg.connect(dsn)
        try:
            for start in range(0, jobs, 10_000):
                await conn.fetchval(
                    ENQUEUE_TENANTS, f"d-{start}-", min(10_000, jobs - start), TENANTS
                )
            await conn.execute(VACUUM)
            await wait_for_quiet(30)
            env = {**ENGINE_ENV, **(KEYED_ENV if keyed else {})}
            async with daemon(dsn, env, wait_ready=False):
                await wait_terminal(conn, jobs, 180, f"{jobs} jobs to finish")
            span = await conn.fetchval(
                "SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8"
                "  FROM dispatcher.jobs"
            )
            limited = await conn.fetchval(
                "SELECT key_max_inflight IS NOT NULL FROM dispatcher.queues WHERE name = 'default'"
            )
            assert bool(limited) == keyed
        finally:
            await conn.close()
    return float(jobs / span)


async def main(args: argparse.Namespace) -> None:
    bench = await Bench("bench_key_limits").open()
    rates: dict[bool, list[float]] = {False: [], True: []}
    for r in range(args.rounds):
        for keyed in (False, True):
            rate = await drain_once(bench.server, args.jobs, keyed)
            rates[keyed].append(rate)
            label = "keyed" if keyed else "plain"
            print(f"    round {r + 1} {label}: {rate:,.0f} jobs/s", flush=True)
    plain, keyed = statistics.median(rates[False]), statistics.median(rates[True])
    bench.details["rates"] = {"plain": rates[False], "keyed": rates[True]}
    bench.add(Figure(f"drain {args.jobs:,} no-op jobs, {TENANTS} tenants, plain", plain, "jobs/s"))
    bench.add(
        Figure(
            f"the same with key limits that do not bind ({TENANTS} keys)",
            keyed,
            "jobs/s",
            note=f"{keyed / plain:.1%} of plain; median of {args.rounds} alternating rounds",
        )
    )
    bench.finish("per-key limits on a drain")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    run(lambda: main(parser.parse_args()))
