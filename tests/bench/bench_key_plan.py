"""The claim's plan with per-key limits, at 10 million rows (issue 22 point 4): a table of N jobs
due in ten years (default 10 million, as bench_scale's W5) beside 2,000 ready jobs over 100
tenants, the queue limiting every key (key_max_inflight 5, key_rate_per_s 100, key_burst 10),
200 jobs already running (two per key, so each has room for three). The claim runs once under
EXPLAIN ANALYZE, auto_explain showing the plans of the statements in claim_pick, keys_at_limit
and key_take; the script prints them and checks that no plan scans a table sequentially and that
the claim stays one statement.

    .venv/bin/python -m tests.bench.bench_key_plan [--rows 10000000] [--keep]

`--keep` keeps the filled database (bench_key_plan_<rows>) for the next run.
"""

from __future__ import annotations

import argparse
import json
import re
import time

import asyncpg

from dispatcher.db.queries import query
from tests.bench.bench_key_limits import ENQUEUE_TENANTS, TENANTS
from tests.bench.bench_scale import fill
from tests.bench.common import Bench, Figure, register_handler, run

ROWS = 10_000_000
READY_JOBS = 2_000
RUNNING = 200  # two per key: every key has room for three more


class RolledBack(Exception):
    """Raised to roll the explained claim back."""


async def ready_with_keys(conn: asyncpg.Connection) -> None:
    """READY_JOBS ready jobs over TENANTS tenants, RUNNING of them running, every key limited."""
    await conn.fetchval(ENQUEUE_TENANTS, "ready-", READY_JOBS, TENANTS)
    await conn.execute(
        "UPDATE dispatcher.queues SET key_max_inflight = 5, key_rate_per_s = 100, key_burst = 10"
        " WHERE name = 'default'"
    )
    await conn.execute(
        """UPDATE dispatcher.job_state SET state = 'running', attempt = 1, lease_owner = 'other',
                  lease_expires_at = now() + interval '1 hour', started_at = now()
            WHERE id IN (SELECT id FROM dispatcher.job_state WHERE state = 'ready'
                          ORDER BY id LIMIT $1)""",
        RUNNING,
    )
    await conn.execute("VACUUM ANALYZE dispatcher.intents, dispatcher.job_state")


async def explain_claim(conn: asyncpg.Connection) -> tuple[list[str], float]:
    """The claim of 500 under EXPLAIN ANALYZE, with the nested statements' plans (auto_explain
    at NOTICE level); rolled back. Returns the plan lines and the claim's time in ms."""
    notices: list[str] = []
    conn.add_log_listener(lambda _c, msg: notices.append(str(msg.message)))
    rows: list[asyncpg.Record] = []
    started = time.monotonic()
    try:
        async with conn.transaction():
            rows = await claim_explained(conn)
            raise RolledBack
    except RolledBack:
        pass
    took_ms = (time.monotonic() - started) * 1000
    lines = [r[0] for r in rows] + [line for n in notices for line in n.splitlines()]
    return lines, took_ms


async def claim_explained(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    """Inside a transaction: the claim under EXPLAIN ANALYZE, nested plans to notices."""
    await conn.execute("LOAD 'auto_explain'")
    for setting, value in {
        "auto_explain.log_min_duration": "0",
        "auto_explain.log_analyze": "on",
        "auto_explain.log_nested_statements": "on",
        "auto_explain.log_level": "notice",
    }.items():
        await conn.execute(f"SET LOCAL {setting} = '{value}'")
    return await conn.fetch(
        "EXPLAIN (ANALYZE, FORMAT TEXT) " + query("claim_ready"),
        "default",  # queue
        500,  # wanted
        ["noop:1"],  # capabilities
        "bench",  # owner
        60.0,  # lease
        2**62,  # no memory budget
        True,
        None,  # no tenant cursor (migration 023)
        None,
    )


async def main(args: argparse.Namespace) -> None:
    bench = await Bench("bench_key_plan").open()
    keep = f"bench_key_plan_{args.rows}" if args.keep else ""
    async with bench.server.database(keep=keep) as dsn:
        await register_handler(dsn, "noop")
        conn = await asyncpg.connect(dsn)
        try:
            if not await conn.fetchval("SELECT count(*) > 0 FROM dispatcher.job_state"):
                print(f"  filling {args.rows:,} future jobs ...", flush=True)
                await fill(conn, args.rows)
                await ready_with_keys(conn)
            lines, took_ms = await explain_claim(conn)
        finally:
            await conn.close()
    seq = [line for line in lines if re.search(r"Seq Scan on (job_state|intents|outbox)", line)]
    print("\n".join(lines))
    bench.details["plan"] = lines
    bench.add(
        Figure(
            f"claim of 500 among {args.rows:,} rows, {READY_JOBS:,} ready, keys limited",
            took_ms,
            "ms",
            note=f"sequential scans of the jobs' tables: {len(seq)} {json.dumps(seq)}",
        )
    )
    bench.finish("the claim's plan with per-key limits")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=ROWS)
    parser.add_argument("--keep", action="store_true")
    run(lambda: main(parser.parse_args()))
