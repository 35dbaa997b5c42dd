"""W5 scale: does the index design hold with millions of future-dated jobs in the table?

Two databases side by side: one empty, one filled with N future-dated jobs (default 10
million). The same measurements run on both, alternating, for several rounds: the due-scan's
claim of a batch, bulk intake, due-to-start latency at a steady 500 jobs/s, and the daemon's
resident memory during a burst of 10,000 due at one instant. Each figure is the median over the
rounds, printed with its ratio to the empty table; the goal is within 10 %. Alternating rounds
expose both tables to the same machine noise; a CHECKPOINT after the fill keeps its writeback
out of the measurements.

    .venv/bin/python -m tests.bench.bench_scale [--rows 10000000] [--rounds 3] [--keep]
        [--index-cleanup-ab]

`--keep` keeps both databases (bench_scale_empty, bench_scale_<rows>) and reuses them on the
next run, so the fill (about 5 minutes for 10 million) is paid once.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import asyncpg
import psutil

from dispatcher.db.queries import query
from tests.bench.bench_engine import EMPTY, ENGINE_ENV, ENQUEUE_BULK, enqueue_bulk, paced_enqueue
from tests.bench.common import Bench, Figure, daemon, register_handler, run, wait_for

FILL_BATCH = 50_000
SCAN_BATCH = 2_000


async def fill(conn: asyncpg.Connection, rows: int) -> float:
    """Insert `rows` jobs due in ten years (scheduled, no outbox rows), in bulk; return jobs/s."""
    due = await conn.fetchval("SELECT now() + interval '10 years'")
    started = time.monotonic()
    for start in range(0, rows, FILL_BATCH):
        await conn.fetchval(
            ENQUEUE_BULK, f"future-{start}-", min(FILL_BATCH, rows - start), due, "noop", None
        )
        if start and start % 1_000_000 == 0:
            print(f"    {start:,} rows in {time.monotonic() - started:.0f} s", flush=True)
    rate = rows / (time.monotonic() - started)
    await conn.execute("VACUUM ANALYZE dispatcher.intents, dispatcher.job_state")
    return rate


async def scan_ms(conn: asyncpg.Connection, rounds: int = 5) -> float:
    """Median time of the due-scan statement moving one batch of due jobs to ready."""
    times = []
    for r in range(rounds):
        prefix = f"scan-{r}-{time.monotonic_ns()}-"
        floor = await id_floor(conn)
        await enqueue_bulk(
            conn, prefix, SCAN_BATCH, due=await conn.fetchval("SELECT now() + interval '1 hour'")
        )
        await conn.execute(
            "UPDATE dispatcher.job_state SET due_at = now() - interval '1 second' WHERE id > $1",
            floor,
        )
        started = time.perf_counter()
        moved = await conn.fetchval(query("scan_due"), SCAN_BATCH, 0.0)
        times.append((time.perf_counter() - started) * 1000)
        assert moved == SCAN_BATCH, moved
        await conn.execute("DELETE FROM dispatcher.outbox")
        await delete_above(conn, floor)
    return statistics.median(times)


async def id_floor(conn: asyncpg.Connection) -> int:
    """The highest job id so far: the jobs a phase adds are those above it. (Reaching them by
    key, `key LIKE 'burst-%'`, would scan all 10 million intents: the key index is unique, not
    a prefix index.)"""
    return int(await conn.fetchval("SELECT coalesce(max(id), 0) FROM dispatcher.job_state"))


async def delete_above(conn: asyncpg.Connection, floor: int) -> None:
    await conn.execute("DELETE FROM dispatcher.job_state WHERE id > $1", floor)
    await conn.execute("DELETE FROM dispatcher.intents WHERE id > $1", floor)


async def intake(tables: dict[str, asyncpg.Connection], calls: int = 6) -> dict[str, float]:
    """Bulk intake (10,000 jobs per call) on every table, call by call in turn (ABBA: empty, full,
    full, empty, ...), so each table meets the same seconds of the machine; each table's rate is
    its jobs over the time of its own calls. Measured a table at a time (five calls, about a
    second, right after a vacuum of the full table), the ratio spread from 0.78 to 1.35 between
    runs of one hour: a second's noise fell on one table only. Both tables are vacuumed and
    checkpointed first, so neither pays for the other's writeback."""
    for conn in tables.values():
        await vacuum(conn)
        await checkpoint(conn)
    floors = {label: await id_floor(conn) for label, conn in tables.items()}
    spent = dict.fromkeys(tables, 0.0)
    due = await next(iter(tables.values())).fetchval("SELECT now() + interval '5 years'")
    order = list(tables)
    for i in range(calls):
        for label in order if i % 2 == 0 else reversed(order):
            started = time.perf_counter()
            await enqueue_bulk(tables[label], f"intake-{i}-{time.monotonic_ns()}", 10_000, due=due)
            spent[label] += time.perf_counter() - started
    for label, conn in tables.items():
        await delete_above(conn, floors[label])
    return {label: calls * 10_000 / seconds for label, seconds in spent.items()}


async def checkpoint(conn: asyncpg.Connection) -> None:
    """Write back what earlier phases dirtied (a vacuum of 10 million rows dirties thousands of
    pages), so that writeback does not land in the next measurement."""
    try:
        await conn.execute("CHECKPOINT")
    except asyncpg.InsufficientPrivilegeError:
        print("  (CHECKPOINT needs the pg_checkpoint role: earlier writeback may show)")


async def latency_and_memory(dsn: str, conn: asyncpg.Connection) -> dict[str, float]:
    async with daemon(dsn, ENGINE_ENV) as d:
        assert d.proc is not None
        pool = await asyncpg.create_pool(dsn, min_size=8, max_size=8)
        assert pool is not None
        floor = await id_floor(conn)
        try:
            await paced_enqueue(pool, 5_000, 500)
            await wait_for(lambda: _none_left(conn, floor), 60, what="paced jobs")
            q = await conn.fetchval(
                """
                SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY d)
                  FROM (SELECT extract(epoch FROM started_at - due_at)::float8 d
                          FROM dispatcher.job_state WHERE id > $1) x""",
                floor,
            )
            burst_floor = await id_floor(conn)
            due = await conn.fetchval("SELECT now() + interval '3 seconds'")
            await enqueue_bulk(conn, "burst-", 10_000, due=due)
            process = psutil.Process(d.proc.pid)
            peak = process.memory_info().rss
            deadline = time.monotonic() + 60
            while not await _none_left(conn, burst_floor) and time.monotonic() < deadline:
                peak = max(peak, process.memory_info().rss)
                await asyncio.sleep(0.02)
            last = await conn.fetchval(
                "SELECT extract(epoch FROM max(started_at) - $1)::float8 "
                "FROM dispatcher.job_state WHERE id > $2",
                due,
                burst_floor,
            )
        finally:
            await pool.close()
    await delete_above(conn, floor)
    return {
        "p50_ms": q[0] * 1000,
        "p99_ms": q[1] * 1000,
        "rss_mb": peak / 2**20,
        "burst_last_start_ms": last * 1000,
    }


async def _none_left(conn: asyncpg.Connection, floor: int) -> bool:
    return bool(
        await conn.fetchval(
            "SELECT NOT EXISTS (SELECT 1 FROM dispatcher.job_state WHERE id > $1 "
            "AND state NOT IN ('succeeded', 'dead', 'cancelled'))",
            floor,
        )
    )


async def watcher(dsn: str) -> asyncpg.Connection:
    """The benchmark's own connection. Its statements find a phase's jobs by `id > floor`; asyncpg
    prepares them, and from the sixth run PostgreSQL kept a generic plan that guesses a third of
    the table above any floor: a sequential scan of all 10 million rows (770 ms) for each poll
    of `_none_left`, which kept one of the machine's cores busy through the paced phase and the
    burst it was measuring. Planned with the floor's value, each poll reads a few index pages."""
    conn = await asyncpg.connect(dsn)
    await conn.execute("SET plan_cache_mode = force_custom_plan")
    return conn


async def measure(dsn: str, conn: asyncpg.Connection) -> dict[str, Any]:
    """One table's figures but bulk intake (measured on both tables together: `intake`)."""
    await vacuum(conn)
    scan = await scan_ms(conn)
    await vacuum(conn)
    return {"scan_ms": scan, **await latency_and_memory(dsn, conn)}


async def vacuum(conn: asyncpg.Connection) -> None:
    """Each phase deletes the rows it added. Vacuum before the next, so one phase's dead rows
    do not weigh on the next (each phase starts from the table a vacuum leaves; autovacuum
    itself waits for 1 % of the full table to change). Since migration 056 this cleans the
    indexes too: before it, on the full table PostgreSQL skipped the index pass (the dead rows
    were on under 2 % of its pages) and the claim index kept every earlier phase's jobs."""
    await conn.execute("VACUUM dispatcher.intents, dispatcher.job_state, dispatcher.outbox")


async def ensure_filled(conn: asyncpg.Connection, rows: int) -> float | None:
    """Fill up to `rows` future jobs unless a kept database already has them; then checkpoint,
    so the fill's writeback does not land in the measurements. Returns the fill rate."""
    have = await conn.fetchval("SELECT count(*) FROM dispatcher.jobs WHERE key LIKE 'future-%'")
    if have == rows:
        print(f"  reusing {rows:,} future jobs", flush=True)
        return None
    await conn.execute(EMPTY)
    rate = await fill(conn, rows)
    await checkpoint(conn)
    return rate


async def main(args: argparse.Namespace) -> None:
    bench = await Bench("bench_scale").open()
    keep = args.keep
    async with (
        bench.server.database(keep="bench_scale_empty" if keep else "") as empty_dsn,
        bench.server.database(keep=f"bench_scale_{args.rows}" if keep else "") as full_dsn,
    ):
        for dsn in (empty_dsn, full_dsn):
            await register_handler(dsn, "noop")
        empty_conn = await watcher(empty_dsn)
        full_conn = await watcher(full_dsn)
        try:
            fill_rate = await ensure_filled(full_conn, args.rows)
            size = await full_conn.fetchval(  # dispatcher.jobs is a view of these two
                "SELECT pg_size_pretty(pg_total_relation_size('dispatcher.intents')"
                " + pg_total_relation_size('dispatcher.job_state'))"
            )
            autovacuum = await full_conn.fetchval("SHOW autovacuum")
            print(
                f"  {args.rows:,} rows ({size}); fill rate {fill_rate or 0:,.0f}/s; "
                f"autovacuum {autovacuum}",
                flush=True,
            )
            if args.index_cleanup_ab:
                await index_cleanup_ab(
                    bench, args.rounds, empty_dsn, full_dsn, empty_conn, full_conn
                )
                return
            rounds: dict[str, list[dict[str, Any]]] = {"empty": [], "full": []}
            for r in range(args.rounds):
                rates = await intake({"empty": empty_conn, "full": full_conn})
                for label, dsn, conn in (
                    ("empty", empty_dsn, empty_conn),
                    ("full", full_dsn, full_conn),
                ):
                    rounds[label].append({**await measure(dsn, conn), "intake": rates[label]})
                    print(f"  round {r + 1}, {label}: {rounds[label][-1]}", flush=True)
        finally:
            await empty_conn.close()
            await full_conn.close()
    empty = _medians(rounds["empty"])
    full = _medians(rounds["full"])
    rows = f"{args.rows:,} future jobs"
    for key, label, unit in (
        ("scan_ms", "due-scan claim of 2,000", "ms"),
        ("intake", "bulk intake, 10,000 per call", "jobs/s"),
        ("p50_ms", "due-to-start p50 at 500/s", "ms"),
        ("p99_ms", "due-to-start p99 at 500/s", "ms"),
        ("burst_last_start_ms", "10,000 burst: last start after T", "ms"),
    ):
        ratio = full[key] / empty[key] if empty[key] else float("nan")
        # the rounds' own ratios: each round's two tables met the same minutes of the machine
        paired = statistics.median(
            f[key] / e[key] for f, e in zip(rounds["full"], rounds["empty"], strict=True) if e[key]
        )
        bench.add(
            Figure(
                f"{label}, {rows}",
                full[key],
                unit,
                note=f"median of {args.rounds}; empty table {empty[key]:.2f}; ratio {ratio:.2f}"
                f" (per round: {paired:.2f})",
            )
        )
    peak_rss = max(m["rss_mb"] for m in rounds["full"])
    bench.add(
        Figure(
            f"daemon RSS peak during the 10,000 burst, {rows}",
            peak_rss,
            "MB",
            at_most=250,
            note=f"highest of {args.rounds}; empty table "
            f"{max(m['rss_mb'] for m in rounds['empty']):.0f} MB",
        )
    )
    bench.details.update(
        {"rounds": rounds, "rows": args.rows, "fill_rate": fill_rate, "autovacuum": autovacuum}
    )
    bench.finish("scale (W5)")


async def index_cleanup_ab(
    bench: Bench,
    rounds: int,
    empty_dsn: str,
    full_dsn: str,
    empty_conn: asyncpg.Connection,
    full_conn: asyncpg.Connection,
) -> None:
    """`--index-cleanup-ab`: each round measures both tables with job_state's vacuum index pass
    always on (migration 056) and with PostgreSQL's default (`auto`: skipped while the dead rows
    sit on under 2 % of the pages), the order alternating, so both settings meet the same hour;
    prints the medians of the per-round ratios (full / empty) for each setting."""
    ratios: dict[str, list[dict[str, float]]] = {"on": [], "auto": []}
    try:
        for r in range(rounds):
            for mode in ("on", "auto") if r % 2 == 0 else ("auto", "on"):
                for conn in (empty_conn, full_conn):
                    await conn.execute(
                        f"ALTER TABLE dispatcher.job_state SET (vacuum_index_cleanup = {mode})"
                    )
                rates = await intake({"full": full_conn, "empty": empty_conn})
                full = {**await measure(full_dsn, full_conn), "intake": rates["full"]}
                empty = {**await measure(empty_dsn, empty_conn), "intake": rates["empty"]}
                ratios[mode].append({key: full[key] / empty[key] for key in full})
                print(f"  round {r + 1}, {mode}: {ratios[mode][-1]}", flush=True)
    finally:
        for conn in (empty_conn, full_conn):
            await conn.execute("ALTER TABLE dispatcher.job_state SET (vacuum_index_cleanup = on)")
    on, auto = _medians(ratios["on"]), _medians(ratios["auto"])
    for key in on:
        bench.add(
            Figure(
                f"{key}, full / empty, index pass on", on[key], "x", note=f"auto: {auto[key]:.2f}"
            )
        )
    bench.details.update({"index_cleanup_ab": ratios})
    bench.finish("scale (W5): vacuum index pass on against auto")


def _medians(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="future jobs to fill")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (medians)")
    parser.add_argument(
        "--keep", action="store_true", help="keep the two databases and reuse them next time"
    )
    parser.add_argument(
        "--index-cleanup-ab",
        action="store_true",
        help="compare job_state's vacuum index pass always on (the schema's) against "
        "PostgreSQL's auto, alternating each round (ratios full / empty per setting)",
    )
    run(lambda: main(parser.parse_args()))
