"""Scale-out: 1, 2 and 3 daemons sharing one database, with the in-process transport and with
RabbitMQ (127.0.0.1:5672), in one run. For each transport and daemon count, on a fresh database
with the daemons up (bench_engine's ENGINE_ENV: no-op python handler, claim batch 1,000, each
daemon's own limiter at 1,000,000/s, burst 100,000, 2,000 in flight):

  (a) drain of 20,000 no-op jobs under each of three global limits, written to the queue's
      registry row once the daemons are up: "configured" (ENGINE_ENV's: 2,000 in flight for all
      daemons together, which three daemons of 2,000 each can reach), "high" (the same rate and
      burst, 100,000 in flight: limits no daemon set here can reach, still accounted by every
      claim) and "none" (NULL: claims skip the accounting). The jobs are enqueued in one
      transaction while the queue is paused (nothing claimed, nothing relayed), the tables
      vacuumed, then the queue resumed. Rate = jobs / (last finished_at - first started_at);
      a drain lasts 1-10 s, so each setting runs --repeat times (interleaved), median kept.
  (b) due-to-start p50/p95/p99 (started_at - due_at) at a steady 500 jobs/s for 10 s, one
      `dispatcher.enqueue` per call, due now (bench_engine's paced enqueue)
  (c) a burst of 2,000 jobs due at one instant T, enqueued 5 s before: last start and last
      finish after T
  (b) and (c) run with the "high" limits (--latency-limits).

Every time is on the database clock. While each workload runs, CPU is metered (daemons,
PostgreSQL backends of the database, the RabbitMQ node, everything else = "others") and
pg_stat_activity is sampled every 20 ms (which named statement each active backend runs and
what it waits on; the running jobs every 100 ms). A workload during which others used more
than --max-others % of a core is run again (at most --tries times); the run with the least
interference is kept, all are recorded. Results go to tests/bench/results/bench_scaleout.json.

    .venv/bin/python -m tests.bench.bench_scaleout [--jobs 20000] [--daemons 1,2,3]
        [--transports in-process,rabbitmq] [--limits configured,high,none]
        [--only drain,latency,burst] [--repeat 3] [--tries 3] [--max-others 40] [--profile]

Where the time goes: on a server that loads pg_stat_statements (shared_preload_libraries), each
drain also reports PostgreSQL's execution time per job of every named statement (reset before
the drain, read after); `--profile` samples the first daemon with py-spy during each drain
(collapsed stacks under /tmp/bench-profiles/; `.venv/bin/pip install py-spy`).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

from dispatcher.db.queries import all_queries
from tests.bench.bench_engine import (
    BURST_2000_TARGET_S,
    EMPTY,
    ENGINE_ENV,
    LATENCY_P99_TARGET_S,
    VACUUM,
    burst_times,
    enqueue_bulk,
    enqueue_burst,
    outcome_counts,
    paced_enqueue,
    start_latency,
    wait_terminal,
    warm_up,
)
from tests.bench.common import (
    UNLIMITED_QUEUE_ENV,
    Bench,
    CpuMeter,
    Figure,
    daemon,
    db_name,
    print_table,
    profiled,
    register_handler,
    run,
    wait_for_quiet,
)

BROKER = "amqp://guest:guest@127.0.0.1:5672/"
DRAIN_TIMEOUT_S = 180.0  # one drain; a slower one is a failure, not a figure
SCALE_TARGET = 0.9  # issue 13: N daemons drain at least 0.9x what one daemon does
ENQUEUE_CONNECTIONS = 16
QUIET_WAIT_S = 10.0  # before each workload (BENCH_QUIET_WAIT_S overrides)

# The queue's global limits in the registry, set once the daemons are up (each daemon's own
# limiter keeps ENGINE_ENV's): "configured" as ENGINE_ENV writes them (2,000 in flight, which
# three daemons of 2,000 each can reach), "high" the same rate and burst with a cap no daemon
# set can reach (the claims still go through claim_grant's accounting), "none" no limits at all.
CONFIGURED = (
    float(UNLIMITED_QUEUE_ENV["DISPATCHER_QUEUES__DEFAULT__RATE_PER_S"]),
    int(UNLIMITED_QUEUE_ENV["DISPATCHER_QUEUES__DEFAULT__BURST"]),
    int(UNLIMITED_QUEUE_ENV["DISPATCHER_QUEUES__DEFAULT__MAX_INFLIGHT"]),
)
LIMITS = {
    "configured": CONFIGURED,
    "high": (CONFIGURED[0], CONFIGURED[1], 100_000),
    "none": (None, None, None),
}
SET_LIMITS = """
UPDATE dispatcher.queues SET rate_per_s = $1, burst = $2, max_inflight = $3,
       tokens = coalesce($2, 0), tokens_at = now()
 WHERE name = 'default'"""

ACTIVITY = """
SELECT left(query, 300) AS query, coalesce(wait_event_type || ':' || wait_event, 'CPU') AS wait
  FROM pg_stat_activity
 WHERE datname = $1 AND state = 'active' AND pid <> pg_backend_pid()"""

ROW_LOCK_WAITS = ("Lock:transactionid", "Lock:tuple")
RUNNING = "SELECT count(*)::int FROM dispatcher.jobs WHERE state = 'running'"

STATEMENTS = """
SELECT query, calls::bigint, total_exec_time::float8 AS ms, rows::bigint
  FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
 WHERE d.datname = $1 AND calls > 0
 ORDER BY total_exec_time DESC"""


# measuring --------------------------------------------------------------------------------
class ActivitySampler:
    """Samples pg_stat_activity of one database: per named statement (dispatcher/db/*.sql),
    how many backends were active on average and what they waited on ("CPU": running or
    runnable, no wait event)."""

    def __init__(self, dsn: str, interval_s: float = 0.02):
        self.dsn = dsn
        self.interval_s = interval_s
        self.samples = 0
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self.running: list[int] = []
        self._names = {text[:300]: name for name, text in all_queries().items()}

    def _name(self, text: str) -> str:
        if text in self._names:
            return self._names[text]
        return next((n for t, n in self._names.items() if text.startswith(t[:120])), "other")

    async def __aenter__(self) -> ActivitySampler:
        self._conn = await asyncpg.connect(self.dsn)
        self._task = asyncio.create_task(self._sample(db_name(self.dsn)))
        return self

    async def _sample(self, database: str) -> None:
        while True:
            for row in await self._conn.fetch(ACTIVITY, database):
                self.counts[(self._name(row["query"]), row["wait"])] += 1
            self.samples += 1
            if self.samples % 5 == 1:  # the queue's in-flight total, against its cap
                self.running.append(await self._conn.fetchval(RUNNING))
            await asyncio.sleep(self.interval_s)

    async def __aexit__(self, *exc: object) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self._conn.close()

    def busy(self) -> dict[str, dict[str, float]]:
        """{statement: {wait: mean backends}}, the busiest statements first."""
        per: dict[str, dict[str, float]] = collections.defaultdict(dict)
        for (name, wait), count in self.counts.most_common():
            per[name][wait] = count / max(1, self.samples)
        return dict(sorted(per.items(), key=lambda kv: -sum(kv[1].values())))

    def lock_share(self, statement_prefix: str) -> float:
        """Of the samples of statements named `statement_prefix*`, the share waiting for a row
        another transaction holds (Lock:transactionid, Lock:tuple; not Lock:extend)."""
        mine = {k: c for k, c in self.counts.items() if k[0].startswith(statement_prefix)}
        locked = sum(c for (_, wait), c in mine.items() if wait in ROW_LOCK_WAITS)
        return locked / max(1, sum(mine.values()))

    def summary(self, top: int = 4) -> str:
        parts = []
        for name, waits in list(self.busy().items())[:top]:
            total = sum(waits.values())
            detail = ", ".join(f"{w} {v:.2f}" for w, v in list(waits.items())[:3])
            parts.append(f"{name} {total:.2f} ({detail})")
        running = (
            f"; running jobs mean {sum(self.running) / len(self.running):,.0f}, "
            f"max {max(self.running):,}"
            if self.running
            else ""
        )
        return "active backends: " + "; ".join(parts) + running


class StatementTimes:
    """PostgreSQL's execution time per named statement during a block, from pg_stat_statements
    (reset on entry); nothing when the server does not load it. Nested statements (the bodies of
    PL/pgSQL functions) are counted too: a function's time is also in its caller's."""

    def __init__(self, dsn: str):
        self.dsn = dsn
        self.available = False
        self.rows: list[dict[str, Any]] = []
        self._names = {text[:300]: name for name, text in all_queries().items()}

    async def __aenter__(self) -> StatementTimes:
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            await conn.execute("SELECT pg_stat_statements_reset()")
            self.available = True
        except asyncpg.PostgresError:  # not in shared_preload_libraries
            self.available = False
        finally:
            await conn.close()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self.available:
            return
        conn = await asyncpg.connect(self.dsn)
        try:
            found = await conn.fetch(STATEMENTS, db_name(self.dsn))
        finally:
            await conn.close()
        per: dict[str, dict[str, float]] = collections.defaultdict(
            lambda: {"calls": 0, "ms": 0.0, "rows": 0}
        )
        for row in found:
            text = " ".join(row["query"].split())
            name = next(
                (n for t, n in self._names.items() if " ".join(t.split())[:80] == text[:80]),
                text[:60],
            )
            for key in ("calls", "ms", "rows"):
                per[name][key] += row[key]
        self.rows = [{"statement": n, **v} for n, v in per.items()]
        self.rows.sort(key=lambda r: -r["ms"])

    def per_job(self, jobs: int, top: int = 8) -> str:
        if not self.available:
            return "pg_stat_statements not loaded"
        return "PostgreSQL us/job by statement: " + "; ".join(
            f"{r['statement']} {r['ms'] * 1e3 / jobs:.1f} ({r['calls']:,} calls)"
            for r in self.rows[:top]
        )


def rabbitmq_pid() -> int | None:
    """The local RabbitMQ node (beam.smp), metered like the daemons."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().strip() == "beam.smp":
                    return int(entry.name)
    return None


async def least_disturbed(
    workload: Callable[[], Awaitable[dict[str, Any]]], args: argparse.Namespace, what: str
) -> dict[str, Any]:
    """Run `workload` until other users took at most --max-others % of a core during it (at
    most --tries times); the least disturbed run is returned, with every run under "runs"."""
    runs: list[dict[str, Any]] = []
    for attempt in range(args.tries):
        await wait_for_quiet(QUIET_WAIT_S)
        runs.append(await workload())
        others = runs[-1]["cpu"]["others"]
        if others <= args.max_others:
            break
        if attempt + 1 < args.tries:
            print(f"    ({what}: others used {others:.0f}% of a core; again)", flush=True)
    best = min(runs, key=lambda r: r["cpu"]["others"])
    return {**best, "runs": [{k: v for k, v in r.items() if k != "runs"} for r in runs]}


def cpu_figures(cpu: CpuMeter, jobs: int) -> dict[str, Any]:
    """CPU per job (us) of the daemons together, PostgreSQL and RabbitMQ, and jobs per second
    of CPU they used together (what one core does)."""
    daemons_s = sum(cpu.cpu_s(n) for n in cpu.process_pct if n.startswith("daemon"))
    used_s = daemons_s + cpu.cpu_s("postgres") + cpu.cpu_s("rabbitmq")
    return {
        "cpu": cpu.as_json(),
        "cpu_summary": cpu.summary(),
        "daemons_us_per_job": daemons_s / jobs * 1e6,
        "postgres_us_per_job": cpu.cpu_s("postgres") / jobs * 1e6,
        "rabbitmq_us_per_job": cpu.cpu_s("rabbitmq") / jobs * 1e6,
        "jobs_per_cpu_s": jobs / used_s if used_s else float("nan"),
    }


# one daemon set ---------------------------------------------------------------------------
class Cell:
    """N daemons of one transport on one fresh database, and the workloads run against them."""

    def __init__(self, dsn: str, daemons: list[Any], transport: str, profile: bool = False):
        self.dsn = dsn
        self.profile = profile
        self.drains = 0
        self.daemons = daemons
        self.transport = transport
        self.pids = {f"daemon{i + 1}": d.proc.pid for i, d in enumerate(daemons)}
        if transport == "rabbitmq" and (pid := rabbitmq_pid()) is not None:
            self.pids["rabbitmq"] = pid

    async def reset(self, conn: asyncpg.Connection) -> None:
        await conn.execute(EMPTY)
        await conn.execute(VACUUM)

    async def drain(self, conn: asyncpg.Connection, jobs: int, limits: str) -> dict[str, Any]:
        await self.reset(conn)
        await conn.execute(SET_LIMITS, *LIMITS[limits])
        await self.enqueue_paused(conn, jobs)
        self.drains += 1
        name = f"drain_{self.transport}_{len(self.daemons)}_{limits}_{self.drains}"
        async with (
            StatementTimes(self.dsn) as statements,
            profiled(self.daemons[0].proc.pid, name, self.profile),
            CpuMeter(self.pids, db_name(self.dsn)) as cpu,
            ActivitySampler(self.dsn) as act,
        ):
            await conn.execute("UPDATE dispatcher.queues SET paused = false, paused_at = NULL")
            await conn.execute("NOTIFY dispatcher_wake, 'ready'")
            await wait_terminal(conn, jobs, DRAIN_TIMEOUT_S, f"{jobs} jobs to finish")
        row = await conn.fetchrow("""
            SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8 AS span_s,
                   count(*) FILTER (WHERE attempt > 1)::int AS retried,
                   -- one claim (one completion) statement stamps all its jobs with its
                   -- transaction's now(): distinct stamps = statements
                   count(DISTINCT started_at)::int AS claims,
                   count(DISTINCT finished_at)::int AS completions,
                   (SELECT count(DISTINCT owner)::int FROM dispatcher.attempt_history a
                     WHERE a.outcome = 'succeeded'
                       AND a.job_id IN (SELECT id FROM dispatcher.jobs)) AS owners
              FROM dispatcher.jobs""")
        return {
            "rate": jobs / row["span_s"],
            "span_s": row["span_s"],
            "owners": row["owners"],
            "retried": row["retried"],
            "jobs_per_claim": jobs / max(1, row["claims"]),
            "jobs_per_completion": jobs / max(1, row["completions"]),
            "states": await outcome_counts(conn),
            **cpu_figures(cpu, jobs),
            "activity": act.busy(),
            "running_max": max(act.running, default=0),
            "activity_summary": act.summary(),
            "claim_lock_share": act.lock_share("claim_"),
            "statements": statements.rows,
            "statements_summary": statements.per_job(jobs),
            "loadavg": os.getloadavg(),
        }

    async def enqueue_paused(self, conn: asyncpg.Connection, jobs: int) -> None:
        """The jobs, ready, in a vacuumed table, while the queue is paused."""
        await conn.execute("UPDATE dispatcher.queues SET paused = true, paused_at = now()")
        async with conn.transaction():  # all visible at once
            await enqueue_bulk(conn, "drain", jobs)
        await conn.execute(VACUUM)
        await wait_for_quiet(QUIET_WAIT_S)

    async def latency(
        self, conn: asyncpg.Connection, pool: asyncpg.Pool, rate: int, seconds: float
    ) -> dict[str, Any]:
        await self.reset(conn)
        n = int(rate * seconds)
        async with CpuMeter(self.pids, db_name(self.dsn)) as cpu, ActivitySampler(self.dsn) as act:
            sent = await paced_enqueue(pool, n, rate)
            await wait_terminal(conn, n, 60, f"{n} paced jobs")
        row = await start_latency(conn)
        p50, p95, p99 = row["q"]
        return {
            "rate_sent": sent,
            "jobs": row["n"],
            "p50_s": p50,
            "p95_s": p95,
            "p99_s": p99,
            "max_s": row["max"],
            "states": await outcome_counts(conn),
            **cpu_figures(cpu, n),
            "activity_summary": act.summary(),
            "loadavg": os.getloadavg(),
        }

    async def burst(self, conn: asyncpg.Connection, n: int) -> dict[str, Any]:
        await self.reset(conn)
        due = await enqueue_burst(conn, "burst", n)
        async with CpuMeter(self.pids, db_name(self.dsn)) as cpu, ActivitySampler(self.dsn) as act:
            await wait_terminal(conn, n, 90, f"burst of {n}")
        row = await burst_times(conn, due)
        return {
            **dict(row),
            "states": await outcome_counts(conn),
            **cpu_figures(cpu, n),
            "activity_summary": act.summary(),
            "loadavg": os.getloadavg(),
        }


@contextlib.asynccontextmanager
async def daemon_set(bench: Bench, n: int, transport: str, profile: bool = False) -> Any:
    """A fresh database with `n` daemons of `transport` up and warmed; yields the Cell."""
    prefix = f"bench{uuid.uuid4().hex[:8]}."
    env = dict(ENGINE_ENV)
    if transport == "rabbitmq":
        env |= {
            "DISPATCHER_TRANSPORT": "rabbitmq",
            "DISPATCHER_RABBITMQ__URL": BROKER,
            "DISPATCHER_RABBITMQ__QUEUE_PREFIX": prefix,
        }
    try:
        async with bench.server.database() as dsn:
            await register_handler(dsn, "noop")
            async with contextlib.AsyncExitStack() as stack:
                procs = [await stack.enter_async_context(daemon(dsn, env)) for _ in range(n)]
                yield Cell(dsn, procs, transport, profile)
    finally:
        if transport == "rabbitmq":
            await delete_queue(prefix + "default")


async def delete_queue(name: str) -> None:
    import aio_pika

    connection = await aio_pika.connect(BROKER)
    async with connection:
        channel = await connection.channel()
        await channel.queue_delete(name)


# the run ------------------------------------------------------------------------------------
def load_text(r: dict[str, Any]) -> str:
    return f"load {r['loadavg'][0]:.1f}, others {r['cpu']['others']:.0f}%"


async def drains(
    cell: Cell, conn: asyncpg.Connection, args: argparse.Namespace, results: dict[str, Any]
) -> None:
    """--repeat rounds of one drain per limit setting (interleaved, so a slow spell of the
    machine hits every setting alike); the median run of each setting is its figure."""
    runs: dict[str, list[dict[str, Any]]] = {limits: [] for limits in args.limits}
    for _ in range(args.repeat):
        for limits in args.limits:

            async def drain(limits: str = limits) -> dict[str, Any]:
                return await cell.drain(conn, args.jobs, limits)

            what = f"drain {len(cell.daemons)} {limits}"
            runs[limits].append(await least_disturbed(drain, args, what))
    for limits, found in runs.items():
        found.sort(key=lambda r: r["rate"])
        r = results[f"drain_{limits}"] = {**found[len(found) // 2], "repeats": found}
        rates = ", ".join(f"{x['rate']:,.0f}" for x in found)
        print(
            f"  {cell.transport:<10} {len(cell.daemons)} daemon(s) drain, limits {limits:<10} "
            f"{r['rate']:>8,.0f} jobs/s (median of {rates}); ran on {r['owners']}; jobs per "
            f"claim {r['jobs_per_claim']:,.0f}, per completion {r['jobs_per_completion']:,.0f}; "
            f"{r['jobs_per_cpu_s']:,.0f} jobs per CPU-s; claims waiting for a row lock "
            f"{r['claim_lock_share']:.0%}; {load_text(r)}\n"
            f"      {r['cpu_summary']}\n      {r['activity_summary']}\n"
            f"      {r['statements_summary']}",
            flush=True,
        )


async def measure_cell(
    bench: Bench, args: argparse.Namespace, n: int, transport: str
) -> dict[str, Any]:
    """Every workload for `n` daemons of `transport`; prints a line per workload."""
    results: dict[str, Any] = {}
    async with daemon_set(bench, n, transport, args.profile) as cell:
        conn = await asyncpg.connect(cell.dsn)
        # more connections than bench_engine's 8, so the paced enqueue keeps nearer 500/s while
        # each commit waits for a WAL flush shared with other users (8: 265-369/s under load)
        pool = await asyncpg.create_pool(
            cell.dsn, min_size=ENQUEUE_CONNECTIONS, max_size=ENQUEUE_CONNECTIONS
        )
        assert pool is not None
        try:
            await warm_up(pool, conn)
            if "drain" in args.only:
                await drains(cell, conn, args, results)
            await conn.execute(SET_LIMITS, *LIMITS[args.latency_limits])
            if "latency" in args.only:

                async def latency() -> dict[str, Any]:
                    return await cell.latency(conn, pool, args.rate, args.seconds)

                r = results["latency"] = await least_disturbed(latency, args, f"latency {n}")
                print(
                    f"  {transport:<10} {n} daemon(s) at {r['rate_sent']:.0f}/s: p50 "
                    f"{r['p50_s'] * 1e3:.1f} ms, p95 {r['p95_s'] * 1e3:.1f} ms, p99 "
                    f"{r['p99_s'] * 1e3:.1f} ms, max {r['max_s'] * 1e3:.1f} ms; {load_text(r)}",
                    flush=True,
                )
            if "burst" in args.only:

                async def burst() -> dict[str, Any]:
                    return await cell.burst(conn, args.burst)

                r = results["burst"] = await least_disturbed(burst, args, f"burst {n}")
                print(
                    f"  {transport:<10} {n} daemon(s) burst of {args.burst:,}: last start "
                    f"{r['last_start'] * 1e3:.0f} ms, last finish {r['last_finish'] * 1e3:.0f} "
                    f"ms after T; {load_text(r)}",
                    flush=True,
                )
        finally:
            await pool.close()
            await conn.close()
    return results


def add_figures(bench: Bench, args: argparse.Namespace, cells: dict[str, Any]) -> None:
    """The run's figures, one per measured number, with the targets of issue 13 and
    bench_engine; then the per-(transport, daemons) matrix the README shows."""
    for key, r in cells.items():
        transport, n = key.split(":")
        who = f"{transport}, {n} daemon{'s' if n != '1' else ''}"
        for limits in args.limits:
            if (d := r.get(f"drain_{limits}")) is None:
                continue
            rates = [x["rate"] for x in d.get("repeats", [d])]
            one = cells.get(f"{transport}:1", {}).get(f"drain_{limits}")
            ratio = f"; {d['rate'] / one['rate']:.2f}x one daemon" if one and n != "1" else ""
            bench.add(
                Figure(
                    f"drain {args.jobs:,}, limits {limits}: {who}",
                    d["rate"],
                    "jobs/s",
                    note=f"median of {', '.join(f'{x:,.0f}' for x in rates)}; "
                    f"{d['jobs_per_cpu_s']:,.0f} jobs per CPU-s{ratio}; "
                    f"claims waiting for a row lock {d['claim_lock_share']:.0%}; {load_text(d)}",
                )
            )
            if one and n != "1":
                bench.add(
                    Figure(
                        f"drain, limits {limits}: {who} / 1 daemon",
                        d["rate"] / one["rate"],
                        "x",
                        at_least=SCALE_TARGET,
                    )
                )
        if (lat := r.get("latency")) is not None:
            bench.add(
                Figure(
                    f"due-to-start p99 at {args.rate}/s: {who}",
                    lat["p99_s"] * 1e3,
                    "ms",
                    at_most=LATENCY_P99_TARGET_S * 1e3,
                    note=f"p50 {lat['p50_s'] * 1e3:.1f} ms, p95 {lat['p95_s'] * 1e3:.1f} ms, "
                    f"max {lat['max_s'] * 1e3:.1f} ms; {load_text(lat)}",
                )
            )
        if (b := r.get("burst")) is not None:
            bench.add(
                Figure(
                    f"burst of {args.burst:,} due at T, last start: {who}",
                    b["last_start"] * 1e3,
                    "ms after T",
                    at_most=BURST_2000_TARGET_S * 1e3 if args.burst == 2000 else None,
                    note=f"last finish {b['last_finish'] * 1e3:.0f} ms after T; {load_text(b)}",
                )
            )


def print_matrix(args: argparse.Namespace, counts: list[int], cells: dict[str, Any]) -> None:
    """One line per transport and workload, one column per daemon count."""
    rows: list[Figure] = []
    for transport in args.transports:

        def cell(n: int, key: str, transport: str = transport) -> dict[str, Any] | None:
            return cells.get(f"{transport}:{n}", {}).get(key)  # type: ignore[no-any-return]

        for limits in args.limits:
            line = [cell(n, f"drain_{limits}") for n in counts]
            if all(line):
                rows.append(
                    Figure(
                        f"{transport}: drain jobs/s, limits {limits}",
                        line[0]["rate"],  # type: ignore[index]
                        "jobs/s",
                        note=" / ".join(f"{c['rate']:,.0f}" for c in line if c)
                        + f" for {','.join(map(str, counts))} daemons",
                    )
                )
        lat = [cell(n, "latency") for n in counts]
        if all(lat):
            rows.append(
                Figure(
                    f"{transport}: p50/p95/p99 ms at {args.rate}/s",
                    lat[0]["p99_s"] * 1e3,  # type: ignore[index]
                    "ms (p99, 1 daemon)",
                    note=" | ".join(
                        "/".join(f"{c[q] * 1e3:.1f}" for q in ("p50_s", "p95_s", "p99_s"))
                        for c in lat
                        if c
                    ),
                )
            )
        burst = [cell(n, "burst") for n in counts]
        if all(burst):
            rows.append(
                Figure(
                    f"{transport}: burst {args.burst:,} last start/finish ms",
                    burst[0]["last_start"] * 1e3,  # type: ignore[index]
                    "ms (start, 1 daemon)",
                    note=" | ".join(
                        f"{c['last_start'] * 1e3:.0f}/{c['last_finish'] * 1e3:.0f}"
                        for c in burst
                        if c
                    ),
                )
            )
    print_table(f"by daemon count ({', '.join(map(str, counts))})", rows)


async def main(args: argparse.Namespace) -> None:
    bench = await Bench("bench_scaleout").open()
    counts = [int(n) for n in args.daemons.split(",")]
    bench.details |= {
        "daemon_env": ENGINE_ENV,
        "limits": {m: LIMITS[m] for m in args.limits},
        "latency_limits": args.latency_limits,
        "cells": {},
    }
    print(
        f"{len(os.sched_getaffinity(0))} cores (shared); drain {args.jobs:,} no-op jobs, "
        f"{args.rate}/s for {args.seconds:.0f} s, burst of {args.burst:,}"
    )
    cells: dict[str, Any] = bench.details["cells"]
    try:
        for transport in args.transports:
            for n in counts:
                cells[f"{transport}:{n}"] = await measure_cell(bench, args, n, transport)
    finally:
        add_figures(bench, args, cells)
        print_matrix(args, counts, cells)
        bench.finish("scale-out")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per drain")
    parser.add_argument("--daemons", default="1,2,3", help="daemon counts, comma-separated")
    parser.add_argument("--transports", type=lambda s: s.split(","), default="in-process,rabbitmq")
    parser.add_argument(
        "--limits",
        type=lambda s: s.split(","),
        default="configured,high,none",
        help="drain with each of these global limits: configured (ENGINE_ENV's), high "
        "(in-flight cap 100,000), none",
    )
    parser.add_argument(
        "--latency-limits", default="high", help="global limits for the latency and the burst"
    )
    parser.add_argument("--rate", type=int, default=500, help="steady enqueue rate, jobs/s")
    parser.add_argument("--seconds", type=float, default=10.0, help="steady-rate duration")
    parser.add_argument("--burst", type=int, default=2000, help="jobs due at one instant")
    parser.add_argument(
        "--only", type=lambda s: s.split(","), default="drain,latency,burst", help="workloads"
    )
    parser.add_argument(
        "--max-others",
        type=float,
        default=40.0,
        help="%% of a core other users may take during a workload before it is run again",
    )
    parser.add_argument("--tries", type=int, default=3, help="runs per workload at most")
    parser.add_argument("--repeat", type=int, default=3, help="drains per setting (median)")
    parser.add_argument(
        "--profile", action="store_true", help="py-spy the first daemon during each drain"
    )
    run(lambda: main(parser.parse_args()))
