"""Idle cost: what daemons with many queues and nothing due cost PostgreSQL, and whether a job
due now still starts at once after the idle spell (issue 24, point 6).

    .venv/bin/python -m tests.bench.bench_idle

Each configuration runs on a fresh database: `BENCH_IDLE_DAEMONS` daemons (default "1,3", one
run each) with `BENCH_IDLE_QUEUES` queues (default 50), nothing enqueued. After a warm-up
(`BENCH_IDLE_WARMUP_S`, default 15 s) the window (`BENCH_IDLE_S`, default 60 s) counts

- statements/s: the transactions PostgreSQL committed or rolled back in that database
  (`pg_stat_database`), every statement a daemon sends outside an explicit transaction being
  one; backends report them about once a second when busy and within 10 s when idle, so the
  window's edges blur by a few statements;
- CPU: the daemons' and the database's backends' (from /proc), as % of one core.

Then 20 jobs are enqueued through the SQL door, one every 100 ms, each due now: their start
latency (started_at - created_at, the database clock) shows the idle daemons still start due
work at once. `BENCH_IDLE_ENV` adds daemon settings (`NAME=value,NAME=value`), e.g.
`DISPATCHER_DATABASE__WAKEUPS=poll`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any

import asyncpg

from tests.bench.common import (
    NOOP_HANDLER_ENV,
    Bench,
    CpuMeter,
    Figure,
    daemon,
    db_name,
    environment_only,
    percentile,
    register_handler,
    run,
    wait_for,
)

LATENCY_JOBS = 20


def queue_env(queues: int) -> dict[str, str]:
    """`queues` queues (q00 ... q49), each named by one of its settings."""
    return {f"DISPATCHER_QUEUES__Q{i:02d}__MAX_INFLIGHT": "10" for i in range(queues)}


def extra_env() -> dict[str, str]:
    pairs = [p for p in os.environ.get("BENCH_IDLE_ENV", "").split(",") if p.strip()]
    return dict(p.strip().split("=", 1) for p in pairs)


async def transactions(conn: asyncpg.Connection, name: str) -> int:
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    return int(
        await conn.fetchval(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1", name
        )
    )


async def start_latencies(dsn: str) -> list[float]:
    """Enqueue LATENCY_JOBS jobs due now, 100 ms apart; their start latencies in ms."""
    conn = await asyncpg.connect(dsn)
    try:
        prefix = f"idle-{time.monotonic_ns()}-"
        for i in range(LATENCY_JOBS):
            await conn.execute(
                "SELECT dispatcher.enqueue($1, 'noop', queue => 'q00')", f"{prefix}{i}"
            )
            await asyncio.sleep(0.1)

        async def all_started() -> bool:
            n = await conn.fetchval(
                "SELECT count(*) FROM dispatcher.jobs WHERE key LIKE $1 AND started_at IS NOT NULL",
                prefix + "%",
            )
            return bool(n == LATENCY_JOBS)

        await wait_for(all_started, 60, what="the latency jobs to start")
        rows = await conn.fetch(
            "SELECT extract(epoch FROM started_at - created_at)::float8 * 1000 AS ms "
            "FROM dispatcher.jobs WHERE key LIKE $1",
            prefix + "%",
        )
        return [r["ms"] for r in rows]
    finally:
        await conn.close()


async def idle_run(bench: Bench, daemons: int, queues: int, window_s: float) -> dict[str, Any]:
    env = {**NOOP_HANDLER_ENV, **queue_env(queues), **extra_env()}
    async with bench.server.database() as dsn, contextlib.AsyncExitStack() as stack:
        await register_handler(dsn, "noop")
        procs = [await stack.enter_async_context(daemon(dsn, env)) for _ in range(daemons)]
        await asyncio.sleep(float(os.environ.get("BENCH_IDLE_WARMUP_S", "15")))
        name = db_name(dsn)
        watcher = await asyncpg.connect(bench.server.url)
        try:
            before = await transactions(watcher, name)
            pids = {f"daemon{i}": p.proc.pid for i, p in enumerate(procs) if p.proc}
            async with CpuMeter(pids, name) as cpu:
                await asyncio.sleep(window_s)
            after = await transactions(watcher, name)
        finally:
            await watcher.close()
        latencies = await start_latencies(dsn)
    daemon_cpu = sum(v for k, v in cpu.process_pct.items() if k.startswith("daemon"))
    return {
        "statements_per_s": (after - before) / cpu.wall_s,
        "daemon_cpu_pct": daemon_cpu,
        "postgres_cpu_pct": cpu.process_pct.get("postgres", 0.0),
        "others_cpu_pct": cpu.others_pct,
        "latency_p50_ms": percentile(latencies, 0.5),
        "latency_max_ms": max(latencies),
        "window_s": cpu.wall_s,
    }


async def main() -> None:
    bench = await Bench("bench_idle").open()
    queues = int(os.environ.get("BENCH_IDLE_QUEUES", "50"))
    window_s = float(os.environ.get("BENCH_IDLE_S", "60"))
    mode = os.environ.get("BENCH_IDLE_ENV", "") or "defaults"
    for daemons in [int(n) for n in os.environ.get("BENCH_IDLE_DAEMONS", "1,3").split(",")]:
        result = await idle_run(bench, daemons, queues, window_s)
        bench.details[f"{daemons}-daemons"] = {**result, "settings": mode}
        what = f"{daemons} daemon{'s' * (daemons > 1)}, {queues} queues idle {window_s:.0f} s"
        bench.add(Figure(f"{what}: statements", result["statements_per_s"], "/s", note=mode))
        bench.add(Figure(f"{what}: daemon CPU", result["daemon_cpu_pct"], "% core"))
        bench.add(Figure(f"{what}: PostgreSQL CPU", result["postgres_cpu_pct"], "% core"))
        bench.add(Figure(f"{what}: then due-now start p50", result["latency_p50_ms"], "ms"))
        bench.add(Figure(f"{what}: then due-now start max", result["latency_max_ms"], "ms"))
    bench.finish("idle cost")


if __name__ == "__main__":
    environment_only(__doc__)
    run(main)
