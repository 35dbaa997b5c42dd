"""Operator control on the hot path: what the queue-pause check costs a claim, and what the
dead-letter trigger costs the state transitions that do not make a job dead.

Straight on the database (no daemon), each statement timed inside a transaction that is rolled
back, so every round sees the same table; the variants alternate round by round so drift in
the machine's load hits both alike.

  (a) claim_ready of 500 out of 100,000 ready jobs: as shipped (one primary-key probe of the
      queue registry per claim) and with the check taken out; and a claim of a paused queue
  (b) scan_due moving 2,000 due jobs and complete_succeeded of 1,000 running jobs, with the
      dead-letter trigger enabled (as shipped) and disabled
  (c) 1,000 running jobs made dead in one statement, without and with an on_dead target (the
      trigger then writes one notification job and its outbox row per death)

    .venv/bin/python -m tests.bench.bench_operator [--rounds 80]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from dispatcher.db.queries import query
from tests.bench.common import Bench, Figure, register_handler, run

READY = 100_000
DUE = 2_000
RUNNING = 1_000
PAUSE_CHECK = (
    "\n       AND NOT EXISTS (SELECT 1 FROM dispatcher.queues q WHERE q.name = $1 AND q.paused)"
)
CLAIM_ARGS = ("default", 500, ["noop:1"], "bench", 60.0, 2**62, True)  # no memory budget

Timed = Callable[[asyncpg.Connection], Awaitable[Any]]


async def rolled_back_ms(conn: asyncpg.Connection, setup: str, work: Timed) -> float:
    """Milliseconds `work` takes inside a transaction that is then rolled back."""
    tx = conn.transaction()
    await tx.start()
    try:
        if setup:
            await conn.execute(setup)
        started = time.perf_counter()
        await work(conn)
        return (time.perf_counter() - started) * 1000
    finally:
        await tx.rollback()


async def alternate(
    conn: asyncpg.Connection, rounds: int, variants: dict[str, tuple[str, Timed]]
) -> dict[str, float]:
    """Median milliseconds of each variant, run in turn `rounds` times (after one warm-up)."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(rounds + 1):
        for name, (setup, work) in variants.items():
            ms = await rolled_back_ms(conn, setup, work)
            if round_:
                times[name].append(ms)
    return {name: statistics.median(values) for name, values in times.items()}


async def seed(conn: asyncpg.Connection) -> None:
    await conn.execute(
        """SELECT count(*) FROM dispatcher.enqueue_many(
               (SELECT array_agg('ready-' || g) FROM generate_series(1, $1) g),
               array_fill('noop'::text, ARRAY[$1]), array_fill('{}'::jsonb, ARRAY[$1]),
               NULL, NULL,
               (SELECT array_agg('t' || (g % 50)) FROM generate_series(1, $1) g))""",
        READY,
    )
    await conn.execute(
        """SELECT count(*) FROM dispatcher.enqueue_many(
               (SELECT array_agg('due-' || g) FROM generate_series(1, $1) g),
               array_fill('noop'::text, ARRAY[$1]), array_fill('{}'::jsonb, ARRAY[$1]),
               array_fill(now() + interval '1 hour', ARRAY[$1]))""",
        DUE,
    )
    await conn.execute(
        """UPDATE dispatcher.jobs SET due_at = now() - interval '1 second'
            WHERE key LIKE 'due-%'"""
    )
    await conn.execute(
        """SELECT count(*) FROM dispatcher.enqueue_many(
               (SELECT array_agg('running-' || g) FROM generate_series(1, $1) g),
               array_fill('noop'::text, ARRAY[$1]), array_fill('{}'::jsonb, ARRAY[$1]),
               array_fill(now() + interval '1 hour', ARRAY[$1]))""",
        RUNNING,
    )
    await conn.execute(
        """UPDATE dispatcher.jobs SET state = 'running', attempt = 3, max_attempts = 3,
                  lease_owner = 'bench', lease_expires_at = now() + interval '1 hour'
            WHERE key LIKE 'running-%'"""
    )
    await conn.execute("VACUUM ANALYZE dispatcher.intents, dispatcher.job_state, dispatcher.outbox")


async def measure(bench: Bench, args: argparse.Namespace, dsn: str) -> None:
    await register_handler(dsn, "noop")
    conn = await asyncpg.connect(
        dsn, server_settings={"plan_cache_mode": "force_custom_plan", "jit": "off"}
    )
    try:
        await seed(conn)
        claim = query("claim_ready")
        assert PAUSE_CHECK in claim, "claim_ready changed: update PAUSE_CHECK"
        unchecked = claim.replace(PAUSE_CHECK, "")

        def claim_with(text: str) -> Timed:
            async def work(c: asyncpg.Connection) -> Any:
                rows = await c.fetch(text, *CLAIM_ARGS)
                return rows

            return work

        pause = "UPDATE dispatcher.queues SET paused = true, paused_at = now()"
        claims = await alternate(
            conn,
            args.rounds,
            {
                "with the pause check": ("", claim_with(claim)),
                "without it": ("", claim_with(unchecked)),
                "paused queue": (pause, claim_with(claim)),
            },
        )
        for name, ms in claims.items():
            bench.add(Figure(f"claim 500 of {READY:,} ready: {name}", ms, "ms"))
        bench.details["claims_ms"] = claims

        running_ids = [
            r["id"]
            for r in await conn.fetch(
                "SELECT id FROM dispatcher.jobs WHERE state = 'running' ORDER BY id"
            )
        ]
        no_trigger = "ALTER TABLE dispatcher.job_state DISABLE TRIGGER jobs_dead_letter_notice"

        async def scan(c: asyncpg.Connection) -> Any:
            return await c.execute(query("scan_due"), DUE, 0.0)

        async def complete(c: asyncpg.Connection) -> Any:
            return await c.fetch(
                query("complete_succeeded"),
                running_ids,
                [3] * RUNNING,
                [None] * RUNNING,
                "bench",
                None,
                None,
                None,
            )

        async def kill(c: asyncpg.Connection) -> Any:
            return await c.execute(
                """UPDATE dispatcher.jobs SET state = 'dead', dead_reason = 'bench',
                          finished_at = now(), lease_owner = NULL, lease_expires_at = NULL
                    WHERE id = ANY ($1::bigint[])""",
                running_ids,
            )

        notify = (
            'UPDATE dispatcher.queues SET on_dead_target = \'{"url": "https://x.example/",'
            ' "method": "POST", "headers": {}, "timeout_s": 30}\''
        )
        for label, work in (
            (f"scan_due of {DUE:,}", scan),
            (f"complete_succeeded of {RUNNING:,}", complete),
        ):
            result = await alternate(
                conn, args.rounds, {"trigger": ("", work), "no trigger": (no_trigger, work)}
            )
            for name, ms in result.items():
                bench.add(Figure(f"{label}: {name}", ms, "ms"))
            bench.details[label] = result
        deaths = await alternate(
            conn, args.rounds, {"no on_dead": ("", kill), "on_dead": (notify, kill)}
        )
        for name, ms in deaths.items():
            bench.add(Figure(f"{RUNNING:,} jobs made dead: {name}", ms, "ms"))
        bench.details["deaths_ms"] = deaths
    finally:
        await conn.close()


async def main(args: argparse.Namespace) -> None:
    bench = await Bench("bench_operator").open()
    try:
        async with bench.server.database() as dsn:
            await measure(bench, args, dsn)
    finally:
        bench.finish("Operator control: cost on the hot path")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=80, help="timed rounds per variant")
    run(lambda: main(parser.parse_args()))
