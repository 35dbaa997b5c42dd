"""The in-process claim's plan at 10 million rows (issue 22; migration 023 claim_pick).

One database holds N jobs (default 10 million): 90 % finished, 10 % ready, the ready ones spread
over 10 priority values and 10,000 tenants (plus one tenant holding a tenth of them). Written by
two INSERT ... SELECT statements, then analyzed. The claim of 500 runs with auto_explain on, so
the plans of the statements inside claim_pick show too: each one's node types, the indexes it
used, the rows it read, and its time. Printed, and kept in tests/bench/results.

    .venv/bin/python -m tests.bench.bench_claim_plan [--rows 10000000] [--keep]

`--keep` keeps the database (bench_claim_plan_<rows>) and reuses it on the next run.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import asyncpg

from dispatcher.db.queries import query
from tests.bench.common import Bench, Figure, register_handler, run
from tests.db.test_claim_plan import nested_plans

BATCH = 500
FILL = """
INSERT INTO dispatcher.intents (id, key, request_hash, queue, tenant, handler, handler_version,
                                payload, max_attempts, max_retry_age_s, priority,
                                concurrency_key)
OVERRIDING SYSTEM VALUE
SELECT g, 'k-' || g, 'v2:0', 'default', t.tenant, 'noop', 1, '{}', 3, 86400, p.priority,
       nullif(t.tenant, '')
  FROM generate_series(1, $1::bigint) g
 CROSS JOIN LATERAL (SELECT CASE WHEN g % 10 = 0 THEN 'big'
                                 ELSE 't' || (g % 10000) END AS tenant) t
 CROSS JOIN LATERAL (SELECT ((g / 7) % 10)::smallint * 10 - 50 AS priority) p
"""
STATES = """
INSERT INTO dispatcher.job_state (id, queue, tenant, capability, state, due_at,
                                  budget_started_at, attempt, started_at, finished_at, priority,
                                  concurrency_key)
SELECT i.id, i.queue, i.tenant, 'noop:1', s.state, now() - interval '1 hour',
       now() - interval '1 hour', CASE WHEN s.state = 'ready' THEN 0 ELSE 1 END,
       CASE WHEN s.state = 'ready' THEN NULL ELSE now() END,
       CASE WHEN s.state = 'ready' THEN NULL ELSE now() END, i.priority, i.concurrency_key
  FROM dispatcher.intents i
 CROSS JOIN LATERAL (SELECT CASE WHEN i.id % 10 = 3 THEN 'ready' ELSE 'succeeded' END
                     AS state) s
"""


async def fill(conn: asyncpg.Connection, rows: int) -> None:
    """`rows` jobs, 90 % finished and 10 % ready (FILL and STATES), vacuumed and analyzed."""
    started = time.monotonic()
    await conn.execute(FILL, rows)
    await conn.execute(STATES)
    await conn.execute("VACUUM ANALYZE dispatcher.intents, dispatcher.job_state")
    print(f"  filled {rows:,} rows in {time.monotonic() - started:.0f} s")


def summary(plan: dict[str, Any]) -> list[str]:
    """One line per node: type, index, rows read, time."""
    lines: list[str] = []

    def walk(node: dict[str, Any], depth: int) -> None:
        index = f" using {node['Index Name']}" if "Index Name" in node else ""
        relation = f" on {node['Relation Name']}" if "Relation Name" in node else ""
        lines.append(
            f"{'  ' * depth}{node['Node Type']}{relation}{index}: rows {node.get('Actual Rows')}"
            f" x{node.get('Actual Loops')}, {node.get('Actual Total Time', 0):.2f} ms"
            + (
                f", removed {node['Rows Removed by Filter']}"
                if "Rows Removed by Filter" in node
                else ""
            )
        )
        for child in node.get("Plans", []):
            walk(child, depth + 1)

    walk(plan, 0)
    return lines


async def main(args: argparse.Namespace) -> None:
    bench = await Bench("bench_claim_plan").open()
    keep = f"bench_claim_plan_{args.rows}" if args.keep else ""
    async with bench.server.database(keep=keep) as dsn:
        await register_handler(dsn, "noop")
        conn = await asyncpg.connect(
            dsn, server_settings={"plan_cache_mode": "force_custom_plan", "jit": "off"}
        )
        try:
            if not await conn.fetchval("SELECT EXISTS (SELECT 1 FROM dispatcher.intents)"):
                await fill(conn, args.rows)
            ready = await conn.fetchval(
                "SELECT count(*) FROM dispatcher.job_state WHERE state = 'ready'"
            )
            timings: list[float] = []
            plans: list[dict[str, Any]] = []
            for _ in range(args.claims):
                async with nested_plans(conn) as seen:
                    started = time.monotonic()
                    rows = await conn.fetch(
                        query("claim_ready"),
                        "default",
                        BATCH,
                        ["noop:1"],
                        "bench",
                        60.0,
                        2**62,
                        True,
                        None,
                        None,
                    )
                    timings.append((time.monotonic() - started) * 1000)
                assert len(rows) == BATCH + 1, len(rows)
                plans = seen  # the last claim's
        finally:
            await conn.close()
    timings.sort()
    bench.add(
        Figure(
            f"claim {BATCH} among {ready:,} ready of {args.rows:,} jobs",
            timings[len(timings) // 2],
            "ms",
            note=f"{args.claims} claims, {', '.join(f'{t:.0f}' for t in timings)} ms "
            "(with auto_explain analyze on)",
        )
    )
    text = [line for plan in plans for line in ["", *summary(plan)]]
    print("\n".join(text))
    seq = [
        line for line in text if "Seq Scan on job_state" in line or "Seq Scan on intents" in line
    ]
    bench.details["plans"] = plans
    bench.details["plan_summary"] = text
    bench.details["sequential_scans_of_job_tables"] = seq
    bench.finish(f"the claim's plan at {args.rows:,} rows")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--claims", type=int, default=5)
    parser.add_argument("--keep", action="store_true")
    run(lambda: main(parser.parse_args()))
