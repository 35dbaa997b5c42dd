"""Dispatch engine: drain throughput, due-to-start latency at a steady rate, bursts at one instant.

The daemon runs as a child process (`dispatcher run`) with the default queue's limits raised
so the limiter never binds (rate 1,000,000/s, burst 100,000, 2,000 in flight, claim batch 1,000).
Jobs enter through the SQL door; every time comes from the database clock (jobs.due_at,
started_at, finished_at).

  (a) drain: 20,000 due no-op jobs (python handler, non-transactional) inserted with the daemon
      stopped; then the daemon starts; rate = jobs / (last finished_at - first started_at)
  (b) the same with `http` jobs (signed) to a loopback target in its own process
  (b') `http-due`: 20,000 signed `http` jobs due at one instant, daemon and target already
      running and warmed up, so CPU per job is the drain's alone (no start-up); --profile
      samples the daemon with py-spy
  (c) due-to-start latency (started_at - due_at) at a steady 500 jobs/s for 10 s, one
      `dispatcher.enqueue` per call, due now
  (d) bursts: 2,000 and 10,000 jobs due at one instant T, enqueued ~5 s before T

    .venv/bin/python -m tests.bench.bench_engine [--jobs 20000] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
from datetime import datetime
from typing import Any

import asyncpg

from tests.bench.common import (
    LOOPBACK_HTTP_ENV,
    NOOP_HANDLER_ENV,
    UNLIMITED_QUEUE_ENV,
    Bench,
    CpuMeter,
    Figure,
    daemon,
    db_name,
    histogram,
    histogram_quantile,
    profiled,
    register_handler,
    run,
    target_process,
    wait_for,
    wait_for_quiet,
)

DRAIN_TARGET_PER_S = 10_000
LATENCY_P99_TARGET_S = 0.025
BURST_2000_TARGET_S = 0.100
HTTP_DAEMON_US_PER_JOB = 120  # issue 14
ENGINE_ENV = {**UNLIMITED_QUEUE_ENV, **NOOP_HANDLER_ENV, **LOOPBACK_HTTP_ENV}
# HTTP workloads sign every request, as a production daemon does (a fixed test secret).
SIGNING_ENV = {
    "DISPATCHER_HTTP__SIGNING_SECRET": "whsec_" + "YmVuY2gtc2lnbmluZy1zZWNyZXQtMzItYnl0ZXMh"
}
HTTP_ENV = {**ENGINE_ENV, **SIGNING_ENV}

# 'n' jobs of one handler, due at $3 (NULL = now), in one statement.
ENQUEUE_BULK = """
SELECT count(*) FROM dispatcher.enqueue_many(
       (SELECT array_agg($1 || g) FROM generate_series(1, $2) g),
       array_fill($4::text, ARRAY[$2]),
       (SELECT array_agg(jsonb_build_object('n', g)) FROM generate_series(1, $2) g),
       CASE WHEN $3::timestamptz IS NULL THEN NULL ELSE array_fill($3::timestamptz, ARRAY[$2]) END,
       NULL, NULL,
       CASE WHEN $5::jsonb IS NULL THEN NULL ELSE array_fill($5::jsonb, ARRAY[$2]) END)
"""
# Nothing left to do: cheap to ask often (partial indexes), unlike counting terminal rows, so
# polling adds little load to the database being measured.
ALL_DONE = """
SELECT NOT EXISTS (SELECT 1 FROM dispatcher.job_state WHERE state = 'ready')
   AND NOT EXISTS (SELECT 1 FROM dispatcher.job_state WHERE state = 'running')
   AND NOT EXISTS (SELECT 1 FROM dispatcher.job_state WHERE state = 'scheduled')
"""
# Every job gone, without a trigger per row (dispatcher.jobs is a view: migration 015).
EMPTY = "TRUNCATE dispatcher.intents, dispatcher.job_state, dispatcher.outbox, dispatcher.attempts"
VACUUM = "VACUUM ANALYZE dispatcher.intents, dispatcher.job_state, dispatcher.outbox"
TERMINAL = "SELECT count(*) FROM dispatcher.jobs WHERE state IN ('succeeded', 'dead', 'cancelled')"


async def enqueue_bulk(
    conn: asyncpg.Connection,
    prefix: str,
    n: int,
    *,
    due: Any = None,
    handler: str = "noop",
    target: dict[str, Any] | None = None,
) -> int:
    total = 0
    for start in range(0, n, 10_000):
        total += await conn.fetchval(
            ENQUEUE_BULK,
            f"{prefix}-{start}-",
            min(10_000, n - start),
            due,
            handler,
            json.dumps(target) if target else None,
        )
    return total


async def wait_terminal(conn: asyncpg.Connection, n: int, timeout_s: float, what: str) -> float:
    """Poll until every job is finished; return the monotonic time it was seen."""

    async def done() -> bool:
        return bool(await conn.fetchval(ALL_DONE))

    seen = await wait_for(done, timeout_s, interval_s=0.05, what=what)
    finished = int(await conn.fetchval(TERMINAL))
    if finished < n:
        raise AssertionError(f"{what}: only {finished} of {n} jobs finished")
    return seen


async def outcome_counts(conn: asyncpg.Connection) -> dict[str, int]:
    rows = await conn.fetch("SELECT state, count(*)::int AS n FROM dispatcher.jobs GROUP BY state")
    return {r["state"]: r["n"] for r in rows}


async def drain_once(args: argparse.Namespace, server: Any, *, http: bool) -> dict[str, Any]:
    """One drain: jobs waiting before the daemon starts; timed on the database clock."""
    n = args.jobs
    async with contextlib.AsyncExitStack() as stack:
        dsn = await stack.enter_async_context(server.database())
        url, target_pid = await stack.enter_async_context(target_process()) if http else ("", 0)
        await register_handler(dsn, "noop")
        conn = await asyncpg.connect(dsn)
        try:
            await enqueue_bulk(
                conn,
                "drain",
                n,
                handler="http" if http else "noop",
                target={"url": url} if http else None,
            )
            ready = await conn.fetchval(
                "SELECT count(*) FROM dispatcher.job_state WHERE state = 'ready'"
            )
            assert ready == n, f"{ready} ready jobs of {n}"
            await conn.execute(VACUUM)
            await wait_for_quiet(30)
            spawned = time.monotonic()
            async with daemon(dsn, HTTP_ENV if http else ENGINE_ENV, wait_ready=False) as d:
                assert d.proc is not None
                pids = {"daemon": d.proc.pid, **({"target": target_pid} if http else {})}
                async with CpuMeter(pids, db_name(dsn)) as cpu:
                    done_at = await wait_terminal(conn, n, 120, f"{n} jobs to finish")
            stats = await conn.fetchrow("""
                SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8 AS span_s,
                       count(*) FILTER (WHERE attempt > 1)::int AS retried
                  FROM dispatcher.jobs""")
            states = await outcome_counts(conn)
        finally:
            await conn.close()
    return {
        "rate": n / stats["span_s"],
        "span_s": stats["span_s"],
        "states": states,
        "retried": stats["retried"],
        "spawn_to_done_s": done_at - spawned,
        "daemon_us_per_job": cpu.cpu_s("daemon") / n * 1e6,
        "postgres_us_per_job": cpu.cpu_s("postgres") / n * 1e6,
        "cpu": cpu.as_json(),
        "cpu_summary": cpu.summary(),
    }


async def drain(bench: Bench, args: argparse.Namespace, *, http: bool) -> None:
    """(a)/(b), repeated; the median run is reported, every run is kept in the details."""
    label = "http to loopback target" if http else "no-op python"
    runs = []
    for _ in range(args.repeat):
        runs.append(await drain_once(args, bench.server, http=http))
        print(f"    run: {runs[-1]['rate']:,.0f} jobs/s; {runs[-1]['cpu_summary']}", flush=True)
    runs.sort(key=lambda r: r["rate"])
    median = runs[len(runs) // 2]
    bench.details[f"drain_{'http' if http else 'noop'}"] = runs
    rates = ", ".join(f"{r['rate']:,.0f}" for r in runs)
    bench.add(
        Figure(
            f"drain {args.jobs:,} due jobs, {label}",
            median["rate"],
            "jobs/s",
            at_least=None if http else DRAIN_TARGET_PER_S,
            note=f"median of {len(runs)} runs ({rates}); "
            f"CPU per job: daemon {median['daemon_us_per_job']:.0f} us, postgres "
            f"{median['postgres_us_per_job']:.0f} us; states {median['states']}; "
            f"{median['cpu_summary']}",
        )
    )


async def http_due(bench: Bench, args: argparse.Namespace) -> None:
    """(b'): signed http jobs due at one instant, the daemon and the target already running
    and warmed up (connections open, statements prepared): the CPU per job of the daemon, the
    target and PostgreSQL is the drain's alone. Repeated; the median run is reported."""
    n = args.jobs
    runs: list[dict[str, Any]] = []
    async with (
        bench.server.database() as dsn,
        target_process() as (url, target_pid),
        daemon(dsn, HTTP_ENV) as d,
    ):
        assert d.proc is not None
        pids = {"daemon": d.proc.pid, "target": target_pid}
        conn = await asyncpg.connect(dsn)
        try:
            await enqueue_bulk(conn, "warm", 200, handler="http", target={"url": url})
            await wait_terminal(conn, 200, 30, "warm-up http jobs")
            for i in range(args.repeat):
                await conn.execute(EMPTY)
                await conn.execute(VACUUM)
                await wait_for_quiet(30)
                due = await enqueue_burst(
                    conn, f"due{i}", n, 3.0, handler="http", target={"url": url}
                )
                async with (
                    CpuMeter(pids, db_name(dsn)) as cpu,
                    profiled(d.proc.pid, f"drain_http_due_{i}", args.profile),
                ):
                    await wait_terminal(conn, n, 120, f"{n} http jobs due at T")
                row = await burst_times(conn, due)
                states = await outcome_counts(conn)
                span_s = row["last_finish"] - row["first_start"]
                runs.append(
                    {
                        "rate": n / span_s,
                        "span_s": span_s,
                        "last_finish_s": row["last_finish"],
                        "states": states,
                        **{f"{k}_us_per_job": cpu.cpu_s(k) / n * 1e6 for k in cpu.process_pct},
                        "loadavg": os.getloadavg(),
                        "cpu": cpu.as_json(),
                        "cpu_summary": cpu.summary(),
                    }
                )
                r = runs[-1]
                print(
                    f"    run: {r['rate']:,.0f} jobs/s; CPU per job: daemon "
                    f"{r['daemon_us_per_job']:.0f} us, target {r['target_us_per_job']:.0f} us, "
                    f"postgres {r['postgres_us_per_job']:.0f} us; load "
                    f"{r['loadavg'][0]:.2f}; {r['cpu_summary']}",
                    flush=True,
                )
        finally:
            await conn.close()
    bench.details["drain_http_due"] = runs
    median = sorted(runs, key=lambda r: r["daemon_us_per_job"])[len(runs) // 2]
    rates = ", ".join(f"{r['rate']:,.0f}" for r in runs)
    bench.add(
        Figure(
            f"{n:,} signed http jobs due at one instant, daemon running: daemon CPU per job",
            median["daemon_us_per_job"],
            "us",
            at_most=HTTP_DAEMON_US_PER_JOB,
            note=f"median of {len(runs)} runs; rates {rates} jobs/s; target "
            f"{median['target_us_per_job']:.0f} us, postgres "
            f"{median['postgres_us_per_job']:.0f} us per job; {median['cpu_summary']}",
        )
    )


async def profile_drain(bench: Bench, args: argparse.Namespace) -> None:
    """py-spy profile of the daemon draining no-op jobs enqueued while it runs (attach first)."""
    async with bench.server.database() as dsn, daemon(dsn, ENGINE_ENV) as d:
        assert d.proc is not None
        conn = await asyncpg.connect(dsn)
        try:
            async with profiled(d.proc.pid, "drain_noop", True):
                await enqueue_bulk(conn, "prof", args.jobs)
                await wait_terminal(conn, args.jobs, 120, "profiled drain")
            print(f"  profiled drain states: {await outcome_counts(conn)}")
        finally:
            await conn.close()


async def warm_up(pool: asyncpg.Pool, conn: asyncpg.Connection, n: int = 20) -> None:
    """A few jobs through the daemon(s), so they prepare their statements on the first claims;
    then an empty jobs table."""
    for i in range(n):
        await pool.execute("SELECT dispatcher.enqueue($1, 'noop')", f"warm-{i}")
    await wait_terminal(conn, n, 30, "warm-up jobs")
    await conn.execute(EMPTY)


async def start_latency(conn: asyncpg.Connection, key_like: str = "lat-%") -> asyncpg.Record:
    """Due-to-start (started_at - due_at, database clock) of the jobs whose key is like
    `key_like`: q = [p50, p95, p99] in seconds, max, n."""
    return await conn.fetchrow(
        """
        SELECT percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY d) AS q,
               max(d) AS max, count(*)::int AS n
          FROM (SELECT extract(epoch FROM started_at - due_at)::float8 AS d
                  FROM dispatcher.jobs WHERE key LIKE $1) x""",
        key_like,
    )


async def enqueue_burst(
    conn: asyncpg.Connection,
    prefix: str,
    n: int,
    lead_s: float = 5.0,
    *,
    handler: str = "noop",
    target: dict[str, Any] | None = None,
) -> datetime:
    """`n` jobs due at one instant T, `lead_s` from now (database clock); returns T once it is
    0.1 s away, so what the caller measures next covers the burst, not the wait for it."""
    due: datetime = await conn.fetchval("SELECT now() + make_interval(secs => $1)", lead_s)
    await enqueue_bulk(conn, prefix, n, due=due, handler=handler, target=target)
    await asyncio.sleep(max(0.0, (due - await db_now(conn)).total_seconds() - 0.1))
    return due


async def burst_times(conn: asyncpg.Connection, due: datetime) -> asyncpg.Record:
    """Seconds after T (= `due`) of the first, median and last start and the last finish of
    every job in the table, and how long before T the last one was enqueued (lead_s)."""
    return await conn.fetchrow(
        """
        SELECT extract(epoch FROM min(started_at) - $1)::float8 AS first_start,
               extract(epoch FROM percentile_cont(0.5) WITHIN GROUP
                       (ORDER BY started_at - $1))::float8 AS p50_start,
               extract(epoch FROM max(started_at) - $1)::float8 AS last_start,
               extract(epoch FROM max(finished_at) - $1)::float8 AS last_finish,
               extract(epoch FROM $1 - max(created_at))::float8 AS lead_s
          FROM dispatcher.jobs""",
        due,
    )


async def steady_latency(bench: Bench, args: argparse.Namespace) -> None:
    """(c): one due-now enqueue per call at a steady rate; started_at - due_at per job."""
    rate, seconds = args.rate, args.seconds
    n = int(rate * seconds)
    async with bench.server.database() as dsn, daemon(dsn, ENGINE_ENV) as d:
        assert d.proc is not None
        pool = await asyncpg.create_pool(dsn, min_size=8, max_size=8)
        assert pool is not None
        conn = await asyncpg.connect(dsn)
        try:
            await warm_up(pool, conn)
            before = await histogram(
                d.base_url, "dispatcher_due_to_start_seconds", 'queue="default"'
            )
            await wait_for_quiet(30)
            async with (
                CpuMeter({"daemon": d.proc.pid}, db_name(dsn)) as cpu,
                profiled(d.proc.pid, "steady_latency", args.profile),
            ):
                sent = await paced_enqueue(pool, n, rate)
                await wait_terminal(conn, n, 60, f"{n} paced jobs")
            after = await histogram(
                d.base_url, "dispatcher_due_to_start_seconds", 'queue="default"'
            )
            row = await start_latency(conn)
            states = await outcome_counts(conn)
        finally:
            await conn.close()
            await pool.close()
    p50, p95, p99 = row["q"]
    hist = {q: histogram_quantile(q, before, after) for q in (0.5, 0.95, 0.99)}
    bench.details["steady_latency"] = {
        "rate_asked": rate,
        "rate_sent": sent,
        "jobs": row["n"],
        "states": states,
        "db_s": {"p50": p50, "p95": p95, "p99": p99, "max": row["max"]},
        "histogram_s": hist,
        "cpu": cpu.as_json(),
    }
    common = f"{row['n']:,} jobs at {sent:.0f}/s"
    bench.add(Figure(f"due-to-start p50 at {rate}/s", p50 * 1000, "ms", note=common))
    bench.add(Figure(f"due-to-start p95 at {rate}/s", p95 * 1000, "ms"))
    bench.add(
        Figure(
            f"due-to-start p99 at {rate}/s",
            p99 * 1000,
            "ms",
            at_most=LATENCY_P99_TARGET_S * 1000,
            note=f"max {row['max'] * 1000:.1f} ms; CPU per job (enqueue included): daemon "
            f"{cpu.cpu_s('daemon') / n * 1e6:.0f} us, postgres "
            f"{cpu.cpu_s('postgres') / n * 1e6:.0f} us; {cpu.summary()}",
        )
    )
    bench.add(
        Figure(
            f"due-to-start p99 at {rate}/s, from the histogram",
            hist[0.99] * 1000,
            "ms",
            note=f"dispatcher_due_to_start_seconds, bucket-interpolated; p50 "
            f"{hist[0.5] * 1000:.1f} ms, p95 {hist[0.95] * 1000:.1f} ms",
        )
    )


async def paced_enqueue(pool: asyncpg.Pool, n: int, rate: float) -> float:
    """Send `n` single enqueues at `rate`/s (each due now); return the achieved rate."""
    tasks = []
    start = time.monotonic()
    for i in range(n):
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(
            asyncio.create_task(pool.execute("SELECT dispatcher.enqueue($1, 'noop')", f"lat-{i}"))
        )
    await asyncio.gather(*tasks)
    return n / max(time.monotonic() - start, 1e-9)


async def bursts(bench: Bench, args: argparse.Namespace) -> None:
    """(d): n jobs all due at one instant T, enqueued ~5 s before it."""
    async with bench.server.database() as dsn:
        if args.custom_plans:
            await force_custom_plans(dsn)
        async with daemon(dsn, ENGINE_ENV) as d:
            await run_bursts(bench, args, dsn, d)


async def force_custom_plans(dsn: str) -> None:
    """Experiment (`--custom-plans`): plan every execution with the current table sizes, for
    every new connection to the benchmark database (the daemon's included)."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"ALTER DATABASE {db_name(dsn)} SET plan_cache_mode = force_custom_plan")
    finally:
        await conn.close()


async def db_now(conn: asyncpg.Connection) -> datetime:
    return await conn.fetchval("SELECT now()")  # type: ignore[no-any-return]


async def run_bursts(bench: Bench, args: argparse.Namespace, dsn: str, d: Any) -> None:
    """Each burst starts from an emptied, vacuumed table (a quiet system), like a nightly batch
    enqueued shortly before its due time."""
    suffix = ", custom plans" if args.custom_plans else ""
    conn = await asyncpg.connect(dsn)
    try:
        for i, n in enumerate(args.bursts):
            await conn.execute(EMPTY)
            await conn.execute(VACUUM)
            await wait_for_quiet(30)
            due = await enqueue_burst(conn, f"burst{i}", n)
            async with (
                CpuMeter({"daemon": d.proc.pid}, db_name(dsn)) as cpu,
                profiled(d.proc.pid, f"burst_{n}", args.profile),
            ):
                await wait_terminal(conn, n, 90, f"burst of {n}")
            row = await burst_times(conn, due)
            states = await outcome_counts(conn)
            bench.details[f"burst_{n}{suffix}"] = {
                **dict(row),
                "states": states,
                "cpu": cpu.as_json(),
            }
            bench.add(
                Figure(
                    f"burst of {n:,} due at T{suffix}: last started",
                    row["last_start"] * 1000,
                    "ms after T",
                    at_most=BURST_2000_TARGET_S * 1000 if n == 2000 else None,
                    note=f"first start {row['first_start'] * 1000:.1f} ms, median "
                    f"{row['p50_start'] * 1000:.1f} ms after T; enqueued "
                    f"{row['lead_s']:.1f} s before T",
                )
            )
            bench.add(
                Figure(
                    f"burst of {n:,} due at T{suffix}: last finished",
                    row["last_finish"] * 1000,
                    "ms after T",
                    note=f"states {states}; CPU per job: daemon "
                    f"{cpu.cpu_s('daemon') / n * 1e6:.0f} us, postgres "
                    f"{cpu.cpu_s('postgres') / n * 1e6:.0f} us; {cpu.summary()}",
                )
            )
    finally:
        await conn.close()


async def main(args: argparse.Namespace) -> None:
    bench = await Bench("bench_engine").open()
    bench.details["daemon_env"] = ENGINE_ENV
    only = (
        set(args.only.split(","))
        if args.only
        else {"drain", "http", "http-due", "latency", "burst"}
    )
    if "drain" in only:
        await drain(bench, args, http=False)
    if "http" in only:
        await drain(bench, args, http=True)
    if "http-due" in only:
        await http_due(bench, args)
    if "latency" in only:
        await steady_latency(bench, args)
    if "burst" in only:
        await bursts(bench, args)
    if args.profile:
        await profile_drain(bench, args)
    bench.finish("dispatch engine")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per drain")
    parser.add_argument("--repeat", type=int, default=3, help="drain runs (median reported)")
    parser.add_argument("--rate", type=int, default=500, help="steady enqueue rate, jobs/s")
    parser.add_argument("--seconds", type=float, default=10.0, help="steady-rate duration")
    parser.add_argument(
        "--bursts",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[2000, 10_000],
        help="burst sizes, comma-separated",
    )
    parser.add_argument(
        "--only", default="", help="comma-separated: drain,http,http-due,latency,burst"
    )
    parser.add_argument(
        "--custom-plans",
        action="store_true",
        help="bursts with plan_cache_mode=force_custom_plan on the database "
        "(an experiment, not a product setting)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also record py-spy profiles of the daemon (/tmp/bench-profiles)",
    )
    run(lambda: main(parser.parse_args()))
