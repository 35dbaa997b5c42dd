"""What the last migration costs a large installation: a database migrated up to the migration
before (`--before`, default the one before the newest), filled with N jobs (default 10 million,
90 % finished, 10 % ready, as bench_claim_plan fills them), then `dispatcher migrate` timed to
the newest, with the lock it holds. Printed: the migration's wall time, whether each of the two
job tables and their indexes kept its storage (no rewrite) and the row count after, unchanged.

    .venv/bin/python -m tests.bench.bench_upgrade [--rows 10000000] [--before 58]

Migration 059 (the single-column checks as domains) is the one this was written for: a column's
change to a domain with checks rewrites its table, to one without them does not.
"""

from __future__ import annotations

import argparse
import time

import asyncpg

from dispatcher.db import schema
from tests.bench.bench_claim_plan import fill
from tests.bench.common import Bench, Figure, register_handler, run
from tests.db.test_checks_as_domains import STORAGE, functions_of_the_version


async def main(args: argparse.Namespace) -> None:
    bench = await Bench("bench_upgrade").open()
    before = args.before or schema.latest_version() - 1
    async with bench.server.database(migrate=False) as dsn:
        conn = await asyncpg.connect(dsn, server_settings={"jit": "off"})
        try:
            await schema.migrate(conn, upto=before)
            await functions_of_the_version(conn, before)  # the views and functions it runs with
            await register_handler(dsn, "noop")
            await fill(conn, args.rows)
            size = await conn.fetchval(
                "SELECT pg_size_pretty(pg_total_relation_size('dispatcher.intents')"
                " + pg_total_relation_size('dispatcher.job_state'))"
            )
            kept = dict(await conn.fetch(STORAGE))
            started = time.monotonic()
            applied = await schema.migrate(conn)
            took = time.monotonic() - started
            after = dict(await conn.fetch(STORAGE))
            rows = await conn.fetchval("SELECT count(*) FROM dispatcher.jobs")
        finally:
            await conn.close()
    rewritten = sorted(name for name, node in kept.items() if after.get(name) != node)
    migrations = [name for name in applied if not name.startswith("functions/")]
    bench.add(
        Figure(
            f"migrate {before} -> {schema.latest_version()} at {args.rows:,} jobs ({size})",
            took,
            "s",
            note=f"{', '.join(migrations)}; rewritten: {', '.join(rewritten) or 'nothing'}",
        )
    )
    bench.details |= {"applied": applied, "rewritten": rewritten, "rows_after": rows}
    assert rows == args.rows, f"{rows} jobs after the upgrade, {args.rows} before"
    bench.finish(f"the upgrade to migration {schema.latest_version()} at {args.rows:,} jobs")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--before", type=int, default=0, help="the version to fill at")
    run(lambda: main(parser.parse_args()))
