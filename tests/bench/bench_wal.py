"""What each step of a job writes: WAL bytes and records per job for intake (the SQL door, due
now), the claim, the completion and the due-scan, each run with the daemon's own statements in
batches. Unlike a timing these counts do not depend on the machine's load, but `pg_stat_wal` is
server-wide: they are exact only on a server nothing else writes to at the time (an embedded or
private PostgreSQL: point DATABASE_URL at one).

    .venv/bin/python -m tests.bench.bench_wal [--jobs 5000] [--batch 1000]

Compare two trees by running this module from each (PYTHONPATH=<tree>, e.g. a git worktree).
"""

from __future__ import annotations

import argparse
import asyncio
import time

import asyncpg

from dispatcher.db.queries import query
from tests.bench.common import Bench, Figure, register_handler, run

ENQUEUE = """
SELECT count(*) FROM dispatcher.enqueue_many(
       (SELECT array_agg($1 || g) FROM generate_series(1, $2) g),
       array_fill('noop'::text, ARRAY[$2::int]), array_fill('{"a": 1}'::jsonb, ARRAY[$2::int]),
       CASE WHEN $3::float8 IS NULL THEN NULL
            ELSE array_fill(now() + make_interval(secs => $3), ARRAY[$2::int]) END)
"""


class Wal:
    """WAL bytes and records written between `start` and `stop`, summed over calls."""

    def __init__(self, conn: asyncpg.Connection):
        self.conn = conn
        self.bytes = self.records = 0

    async def _now(self) -> tuple[int, int]:
        await self.conn.execute("SELECT pg_stat_force_next_flush()")
        return await self.conn.fetchrow(  # type: ignore[return-value]
            "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn, wal_records FROM pg_stat_wal"
        )

    async def measure(self, statement: str, *args: object) -> list[asyncpg.Record]:
        lsn0, records0 = await self._now()
        rows = await self.conn.fetch(statement, *args)
        lsn1, records1 = await self._now()
        self.bytes += int(lsn1 - lsn0)
        self.records += records1 - records0
        return rows


async def main(args: argparse.Namespace) -> None:
    bench = await Bench("bench_wal").open()
    n, batch = args.jobs, args.batch
    async with bench.server.database() as dsn:
        await register_handler(dsn, "noop")
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("CHECKPOINT")
            steps = {name: Wal(conn) for name in ("intake", "claim", "completion", "due-scan")}
            for i in range(n // batch):
                await steps["intake"].measure(ENQUEUE, f"now-{i}-", batch, None)
            claimed = 0
            while True:
                rows = await steps["claim"].measure(
                    query("claim_ready"), "default", batch, ["noop:1"], "bench:1", 60.0
                )
                jobs = [r for r in rows if r[0] is not None]
                if not jobs:
                    break
                claimed += len(jobs)
                await steps["completion"].measure(
                    query("complete_succeeded"),
                    [j[0] for j in jobs],
                    [j[8] for j in jobs],
                    [None] * len(jobs),
                    "bench:1",
                    [None] * len(jobs),
                    [0.001] * len(jobs),
                    [None] * len(jobs),
                )
            assert claimed == n, f"claimed {claimed} of {n}"
            for i in range(n // batch):  # due in a second: then the scan moves them
                await conn.execute(ENQUEUE, f"later-{i}-", batch, 1.0)
            deadline = time.monotonic() + 30
            while await conn.fetchval(
                "SELECT count(*) FROM dispatcher.jobs WHERE state = 'scheduled'"
            ):
                assert time.monotonic() < deadline, "the scan did not move every job"
                if not await conn.fetchval(
                    "SELECT count(*) FROM dispatcher.jobs"
                    " WHERE state = 'scheduled' AND due_at <= now()"
                ):
                    await asyncio.sleep(0.05)
                    continue
                await steps["due-scan"].measure(query("scan_due"), batch, 0.0)
        finally:
            await conn.close()
    for name, wal in steps.items():
        bench.add(Figure(f"{name}: WAL bytes per job", wal.bytes / n, "B"))
        bench.add(Figure(f"{name}: WAL records per job", wal.records / n, "records"))
    bench.details.update({"jobs": n, "batch": batch})
    bench.finish("WAL written per job, by step")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5000, help="jobs per step")
    parser.add_argument("--batch", type=int, default=1000, help="jobs per statement")
    run(lambda: main(parser.parse_args()))
