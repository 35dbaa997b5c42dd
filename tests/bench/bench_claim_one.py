"""The claim of one job in W3's shape, timed: one enqueue, then `dispatcher.claim_ready` as the
benchmarks' daemon sends it (up to 1,000 jobs, parked permits), then the job's completion, over
and over; the claim's round trip measured by the client. Variants of the schema (as in
`bench_instructions`: `--variant NAME=SQL` run after the migration, `--without INDEX`) each get
a database of their own on the same server, and their blocks of claims alternate (the order
turned each round), so a machine whose speed drifts moves every variant alike.

Prints each variant's round trip (p50, p90, mean) and, where `pg_stat_statements` is loaded,
the server's execution of the claim; ratios against the schema as migrated. The counted figure
(`bench_instructions --workloads claim_one_limited`) does not move with the machine; this one
says what the count is worth in time.

    DATABASE_URL=postgresql://... .venv/bin/python -m tests.bench.bench_claim_one
        [--variant before="$(git show REV:dispatcher/db/functions/10_claim_ready.sql)"]
        [--rounds 10] [--claims 500]

Without DATABASE_URL a scratch embedded PostgreSQL is used (no `pg_stat_statements`); with it,
the variants' databases are created there and dropped at the end. About a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import asyncpg

from dispatcher.db.embedded import EmbeddedPostgres
from tests.bench.bench_instructions import (
    add_variant_arguments,
    database_url,
    parse_variants,
    prepare,
)
from tests.bench.common import Figure, machine_info, percentile, print_table
from tests.bench.common import save_results as save

SETUP = (  # the benchmarks' daemon's limits (common.py, UNLIMITED_QUEUE_ENV), no cap reached
    "UPDATE dispatcher.queues SET rate_per_s = 1000000, burst = 100000, max_inflight = 1000000"
    " WHERE name = 'default'",
    "CREATE EXTENSION IF NOT EXISTS pg_stat_statements",
)
ENQUEUE = "SELECT dispatcher.enqueue($1, 'noop')"
CLAIM = (
    "SELECT * FROM dispatcher.claim_ready('default', 1000, ARRAY['noop:1'], 'bench', 60,"
    " 9223372036854775807, false, NULL, NULL)"
)
# the completion, kept out of the time: the running jobs stay as few as in W3
FINISH = (
    "UPDATE dispatcher.job_state SET state = 'succeeded', finished_at = now(),"
    " lease_owner = NULL, lease_expires_at = NULL WHERE id = $1"
)
EXECUTION = (
    "SELECT sum(total_exec_time) / nullif(sum(calls), 0) FROM pg_stat_statements"
    " WHERE query LIKE 'SELECT * FROM dispatcher.claim_ready%'"
    "   AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


class Stream:
    """One variant's connection and statements."""

    def __init__(
        self,
        conn: asyncpg.Connection,
        counted: bool,
        statements: tuple[asyncpg.PreparedStatement, ...],
    ):
        self.conn = conn
        self.counted = counted  # pg_stat_statements is loaded
        self.enqueue, self.claim, self.finish = statements
        self.round_trips: list[float] = []

    @classmethod
    async def open(cls, url: str) -> Stream:
        conn = await asyncpg.connect(url)
        await conn.execute(SETUP[0])
        try:
            await conn.execute(SETUP[1])
            await conn.fetchval("SELECT pg_stat_statements_reset()")
            counted = True
        except asyncpg.PostgresError:  # not in shared_preload_libraries
            counted = False
        statements = tuple([await conn.prepare(sql) for sql in (ENQUEUE, CLAIM, FINISH)])
        return cls(conn, counted, statements)

    async def block(self, tag: str, claims: int, *, timed: bool = True) -> None:
        for i in range(claims):
            await self.enqueue.fetchval(f"{tag}-{i}")
            started = time.perf_counter()
            rows = await self.claim.fetch()
            elapsed = time.perf_counter() - started
            if rows[0]["id"] is None:
                raise SystemExit(f"a claim found no job: {dict(rows[-1])}")
            await self.finish.fetch(rows[0]["id"])
            if timed:
                self.round_trips.append(elapsed)

    async def execution_ms(self) -> float | None:
        return await self.conn.fetchval(EXECUTION) if self.counted else None


async def measure(dsn: str, variants: dict[str, list[str]], args: argparse.Namespace) -> None:
    names = {variant: f"claim_one_{variant}" for variant in variants}
    streams: dict[str, Stream] = {}
    try:  # the databases are dropped whatever fails, their creation included
        await prepare(dsn, {names[v]: statements for v, statements in variants.items()})
        for variant in variants:  # each kept as it opens, so the end closes it
            streams[variant] = await Stream.open(database_url(dsn, names[variant]))
        for variant, stream in streams.items():  # plans kept, caches warm
            await stream.block(f"warm-{variant}", 300, timed=False)
            if stream.counted:
                await stream.conn.fetchval("SELECT pg_stat_statements_reset()")
        order = list(streams)
        for n in range(args.rounds):
            for variant in order if n % 2 == 0 else order[::-1]:
                await streams[variant].block(f"r{n}", args.claims)
        version = await streams["as_migrated"].conn.fetchval("SELECT version()")
        figures = await report(streams)
    finally:
        for stream in streams.values():
            await stream.conn.close()
        if os.environ.get("DATABASE_URL"):
            admin = await asyncpg.connect(dsn)
            for name in names.values():
                await admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
            await admin.close()
    print_table("The claim of one job, W3's shape (ms)", figures)
    path = save("bench_claim_one", machine_info(version, {}), figures)
    print(f"\nresults appended to {path}")


async def report(streams: dict[str, Stream]) -> list[Figure]:
    figures = []
    base: dict[str, float] = {}
    for variant, stream in streams.items():
        trips = [1000 * t for t in stream.round_trips]
        measured = {
            "round trip p50": percentile(trips, 0.5),
            "round trip p90": percentile(trips, 0.9),
            "round trip mean": statistics.mean(trips),
        }
        executed = await stream.execution_ms()
        if executed is not None:
            measured["server execution mean"] = executed
        for label, value in measured.items():
            if variant == "as_migrated":
                base[label] = value
            note = f"{value / base[label]:.3f} x as migrated" if variant != "as_migrated" else ""
            figures.append(Figure(f"{label} [{variant}]", value, "ms", note=note))
    return figures


async def main(args: argparse.Namespace) -> None:
    variants = parse_variants(args)
    dsn = os.environ.get("DATABASE_URL")
    if dsn:
        await measure(dsn, variants, args)
        return
    with tempfile.TemporaryDirectory(prefix="bench-claim-one-") as state:
        server = EmbeddedPostgres(Path(state), role="command")
        try:
            await measure(server.start(), variants, args)
        finally:
            server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="blocks per variant (default 10)")
    parser.add_argument("--claims", type=int, default=500, help="claims per block (default 500)")
    add_variant_arguments(parser)
    parsed = parser.parse_args()
    if parsed.rounds < 1 or parsed.claims < 1:
        parser.error("--rounds and --claims take a positive number")
    asyncio.run(main(parsed))
