"""Peer benchmark: dispatcher side by side with graphile-worker, pg-boss and procrastinate, the
same workloads on the same PostgreSQL, in one run.

    .venv/bin/python -m tests.bench.peers.run [--quick] [--systems dispatcher,pg-boss,...]

The peers are installed afresh into a temporary folder this script creates and removes
(graphile-worker 0.17.x and pg-boss 10.x with `npm install --prefix`, procrastinate into its own
venv); nothing is installed into the project. Every workload of every system runs on a fresh
database of its own. Workloads (full sizes; `--quick`: one repetition, smaller counts):

  W1  enqueue 20,000 no-op jobs: in bulk (each system's batch call, 10,000 per call), then one
      at a time from 16 concurrent clients
  W2  drain 20,000 queued no-op jobs: queued first, then the worker starts; rate = jobs /
      (moment no unfinished job is left - first handler start)
  W3  start latency at a steady 500 jobs/s for 10 s, each due now: handler start - enqueue time
  W4  burst: 10,000 jobs all due at one instant T, enqueued ~5 s before T: last handler start
      and the moment no unfinished job is left, both after T

Times come from one clock: the machine's wall clock, read in the handler on entry (each system
records its handler's start) and by the enqueuing client; "finished" is when the database shows no
unfinished job (polled). With the server on this machine (its processes readable in /proc),
PostgreSQL's CPU per job is measured too: every server process's CPU time, reaped connections
included, over W1's bulk call and over W2 from the worker's start to its stop; their sum is a job's
whole life in PostgreSQL (run on a private server: any other database's load would count). The
medians of the repetitions are printed with each system's ratio to dispatcher, and written to
`tests/bench/results/peers.json`. Every workload is bounded in time; a system that does not finish
in time is reported as not keeping up.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

from tests.bench.bench_engine import ALL_DONE, ENGINE_ENV, enqueue_bulk, paced_enqueue
from tests.bench.common import (
    RESULTS_DIR,
    ROOT,
    Server,
    ServerCpu,
    daemon,
    describe_machine,
    machine_info,
    peak_rss_mb,
    percentile,
    register_handler,
    run,
    wait_for_quiet,
)

HERE = Path(__file__).resolve().parent
GRAPHILE_SPEC = "graphile-worker@0.17"
PG_BOSS_SPEC = "pg-boss@10"
PROCRASTINATE_SPECS = ["procrastinate>=3,<4", "psycopg[binary,pool]"]
SYSTEMS = ("dispatcher", "graphile-worker", "pg-boss", "procrastinate")
WARMUP_JOBS = 20
_RECORD_FILES = itertools.count(1)

# Each system at its best documented settings for many small jobs.
SETTINGS: dict[str, dict[str, Any]] = {
    # the queue limits of tests/bench/bench_engine.py (limiter never binds; claim batch 1,000)
    "dispatcher": {
        k.removeprefix("DISPATCHER_").lower(): v for k, v in ENGINE_ENV.items() if "QUEUES" in k
    },
    # the configuration of graphile-worker's performance page (local queue, batched completion);
    # pollInterval (how often jobs that become due later are looked for) lowered from 2,000 ms
    # to the 500 ms every peer polls at here
    "graphile-worker": {
        "concurrency": 24,
        "max_pool_size": 25,
        "local_queue_size": 500,
        "complete_job_batch_delay_ms": 0,
        "fail_job_batch_delay_ms": 0,
        "poll_interval_ms": 500,
    },
    # v10 has no teamSize: concurrency is several work() calls, each fetching batchSize jobs
    # per poll, at most one poll per interval (0.5 s, the shortest v10 accepts). Drain rate is
    # then about workers x batchSize / 0.5 s: 4 x 500 holds at most 2,000 jobs at once, like
    # dispatcher's max_inflight (more raises it; try --setting pg-boss.workers=16)
    "pg-boss": {"workers": 4, "batch_size": 500, "max_pool_size": 10, "polling_interval_s": 0.5},
    # one async worker process; fetch_job_polling_interval lowered from 5 s to 0.5 s
    "procrastinate": {"concurrency": 20, "max_pool_size": 24, "fetch_job_polling_interval_s": 0.5},
}


@dataclass(frozen=True)
class Sizes:
    repetitions: int
    bulk: int
    single: int
    clients: int
    drain: int
    rate: int
    seconds: float
    burst: int
    lead_s: float
    quiet_s: float  # at most this long waiting for a quiet machine before each workload


FULL = Sizes(3, 20_000, 20_000, 16, 20_000, 500, 10.0, 10_000, 5.0, 8.0)
QUICK = Sizes(1, 5_000, 5_000, 16, 5_000, 500, 4.0, 2_000, 5.0, 3.0)


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str
    higher_is_better: bool


METRICS = [
    Metric("enqueue_bulk", "W1 enqueue, bulk", "jobs/s", True),
    Metric("enqueue_single", "W1 enqueue, 1 per call, 16 clients", "jobs/s", True),
    Metric("drain", "W2 drain", "jobs/s", True),
    Metric("latency_p50", "W3 start latency p50", "ms", False),
    Metric("latency_p95", "W3 start latency p95", "ms", False),
    Metric("latency_p99", "W3 start latency p99", "ms", False),
    Metric("burst_last_start", "W4 burst: last started", "ms after T", False),
    Metric("burst_last_finish", "W4 burst: last finished", "ms after T", False),
    Metric("pg_cpu_bulk", "PostgreSQL CPU per job, W1 bulk", "us", False),
    Metric("pg_cpu_drain", "PostgreSQL CPU per job, W2 drain", "us", False),
    Metric("pg_cpu_lifecycle", "PostgreSQL CPU per job, bulk + drain", "us", False),
]
WORKLOAD_METRICS = {
    "W1": ["enqueue_bulk", "enqueue_single", "pg_cpu_bulk"],
    "W2": ["drain", "pg_cpu_drain"],
    "W3": ["latency_p50", "latency_p95", "latency_p99"],
    "W4": ["burst_last_start", "burst_last_finish"],
}


class CannotKeepUp(Exception):
    """A workload did not finish within its bound."""


class Failed(Exception):
    """A peer's command failed (its error is the message)."""


# the systems ------------------------------------------------------------------------------
@dataclass
class Records:
    """Handler start times (wall clock, s) and each job's reference time (enqueue time or due
    instant, s; None when the job carried none), as written by a worker when it stops."""

    starts: list[float] = field(default_factory=list)
    refs: list[float | None] = field(default_factory=list)
    peak_rss_mb: float = 0.0  # the worker's highest resident memory, where it is measured

    def memory(self) -> dict[str, float]:
        """The worker's peak RSS as an extra figure of the workload (dispatcher's daemon)."""
        return {"_worker_peak_rss_mb": self.peak_rss_mb} if self.peak_rss_mb else {}

    @classmethod
    def load(cls, path: Path) -> Records:
        if not path.exists():
            return cls()
        data = json.loads(path.read_text())
        return cls(data["starts"], data["refs"])


class System:
    """What a workload needs from a system: a fresh database, three ways to enqueue, a worker,
    and two questions to the database (anything left to start? anything left unfinished?)."""

    name: str
    queued_sql: str  # true while jobs wait to start (cheap: asked every 50 ms)
    done_sql: str  # true when no job is unfinished
    remaining_sql: str  # how many are unfinished

    def __init__(self, server: Server, tmp: Path, cpu: ServerCpu | None = None):
        self.server = server
        self.tmp = tmp
        self.cpu = cpu  # PostgreSQL's CPU meter, when its processes are readable here

    @contextlib.asynccontextmanager
    async def pg_cpu(self, figures: dict[str, float], key: str, jobs: int) -> AsyncIterator[None]:
        """PostgreSQL's CPU per job (us) over the block, into `figures[key]`; nothing when the
        server is not on this machine."""
        before = self.cpu.seconds() if self.cpu else 0.0
        yield
        if self.cpu:
            figures[key] = (self.cpu.seconds() - before) / jobs * 1e6

    @contextlib.asynccontextmanager
    async def database(self) -> AsyncIterator[str]:
        async with self.server.database(migrate=False) as dsn:
            await self.setup(dsn)
            yield dsn

    async def setup(self, dsn: str) -> None:
        raise NotImplementedError

    async def bulk(self, dsn: str, n: int, run_at: float | None = None) -> dict[str, Any]:
        raise NotImplementedError

    async def single(self, dsn: str, n: int, clients: int) -> dict[str, Any]:
        raise NotImplementedError

    async def paced(self, dsn: str, rate: int, seconds: float) -> dict[str, Any]:
        raise NotImplementedError

    def worker(self, dsn: str) -> contextlib.AbstractAsyncContextManager[Records]:
        raise NotImplementedError


class Dispatcher(System):
    name = "dispatcher"
    queued_sql = (
        "SELECT EXISTS (SELECT 1 FROM dispatcher.job_state WHERE state = 'ready') "
        "OR EXISTS (SELECT 1 FROM dispatcher.job_state WHERE state = 'scheduled')"
    )
    done_sql = ALL_DONE
    remaining_sql = (
        "SELECT count(*) FROM dispatcher.jobs WHERE state NOT IN ('succeeded', 'dead', 'cancelled')"
    )

    @contextlib.asynccontextmanager
    async def database(self) -> AsyncIterator[str]:
        async with self.server.database() as dsn:  # migrated by `dispatcher migrate`
            await register_handler(dsn, "noop")
            yield dsn

    async def bulk(self, dsn: str, n: int, run_at: float | None = None) -> dict[str, Any]:
        conn = await asyncpg.connect(dsn)
        try:
            due = datetime.fromtimestamp(run_at, UTC) if run_at else None
            t0 = time.time()
            created = await enqueue_bulk(conn, f"bulk{time.monotonic_ns()}", n, due=due)
            done = time.time()
        finally:
            await conn.close()
        return {"n": created, "elapsed_s": done - t0, "finished_at": done}

    async def single(self, dsn: str, n: int, clients: int) -> dict[str, Any]:
        pool = await asyncpg.create_pool(dsn, min_size=clients, max_size=clients)
        assert pool is not None
        prefix = f"one{time.monotonic_ns()}-"
        sent = 0

        async def client() -> None:
            # each caller keeps its connection, as node-postgres' pool (pg-boss, graphile-worker)
            # hands one out per query without resetting it: asyncpg's pool.execute() adds a
            # reset round trip per call (RESET ALL, UNLISTEN *, ...), ~80 us of this process's
            # CPU per job on the 2 cores the database shares
            nonlocal sent
            async with pool.acquire() as conn:
                while sent < n:
                    sent += 1
                    await conn.execute("SELECT dispatcher.enqueue($1, 'noop')", f"{prefix}{sent}")

        try:
            await pool.execute("SELECT dispatcher.enqueue($1, 'noop')", f"{prefix}first")
            t0 = time.time()
            await asyncio.gather(*(client() for _ in range(clients)))
            return {"n": sent, "elapsed_s": time.time() - t0}
        finally:
            await pool.close()

    async def paced(self, dsn: str, rate: int, seconds: float) -> dict[str, Any]:
        pool = await asyncpg.create_pool(dsn, min_size=8, max_size=8)
        assert pool is not None
        try:
            n = round(rate * seconds)
            achieved = await paced_enqueue(pool, n, rate)  # bench_engine's, keys lat-<i>
            return {"n": n, "rate": achieved}
        finally:
            await pool.close()

    @contextlib.asynccontextmanager
    async def worker(self, dsn: str) -> AsyncIterator[Records]:
        out = self.tmp / f"{self.name}-{next(_RECORD_FILES)}.json"
        env = {
            **ENGINE_ENV,
            "DISPATCHER_HANDLERS__NOOP__FUNCTION": "tests.bench.peers.handlers:record",
            "PEERS_RECORD_FILE": str(out),
        }
        records = Records()
        try:
            async with daemon(dsn, env) as d:
                try:
                    yield records
                finally:
                    records.peak_rss_mb = peak_rss_mb(d.proc.pid)
        finally:
            loaded = Records.load(out)
            records.starts, records.refs = loaded.starts, loaded.refs


class Peer(System):
    """A peer driven through its script (`<runtime> <script> <command> '<json>'`)."""

    env: dict[str, str]

    def argv(self) -> list[str]:
        raise NotImplementedError

    async def command(self, command: str, timeout_s: float, **args: Any) -> dict[str, Any]:
        log = self.tmp / f"{self.name}.log"
        with log.open("ab") as err:
            proc = await asyncio.create_subprocess_exec(
                *self.argv(),
                command,
                json.dumps(args),
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                env={**os.environ, **self.env},
                start_new_session=True,
            )
            out = await _communicate(proc, timeout_s)
            if out is None:
                raise CannotKeepUp(f"`{command}` did not finish in {timeout_s:.0f} s")
        if proc.returncode != 0:
            raise Failed(f"`{command}` exited {proc.returncode}: {_tail(log, self.tmp)}")
        lines = [line for line in out.decode().splitlines() if line.strip()]
        return json.loads(lines[-1]) if lines else {}

    async def setup(self, dsn: str) -> None:
        await self.command("setup", 120, dsn=dsn)

    async def bulk(self, dsn: str, n: int, run_at: float | None = None) -> dict[str, Any]:
        return await self.command("bulk", 120, dsn=dsn, n=n, run_at=run_at)

    async def single(self, dsn: str, n: int, clients: int) -> dict[str, Any]:
        return await self.command("single", 300, dsn=dsn, n=n, clients=clients)

    async def paced(self, dsn: str, rate: int, seconds: float) -> dict[str, Any]:
        return await self.command("paced", seconds + 60, dsn=dsn, rate=rate, seconds=seconds)

    @contextlib.asynccontextmanager
    async def worker(self, dsn: str) -> AsyncIterator[Records]:
        out = self.tmp / f"{self.name}-{next(_RECORD_FILES)}.json"
        log = self.tmp / f"{self.name}.log"
        args = {"dsn": dsn, "out": str(out), **SETTINGS[self.name]}
        with log.open("ab") as err:
            proc = await asyncio.create_subprocess_exec(
                *self.argv(),
                "work",
                json.dumps(args),
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                env={**os.environ, **self.env},
                start_new_session=True,
            )
        records = Records()
        try:
            assert proc.stdout is not None
            try:
                line = await asyncio.wait_for(proc.stdout.readline(), 60)
            except TimeoutError:
                line = b""
            if line.strip() != b"READY":
                raise Failed(f"worker did not start: {_tail(log, self.tmp)}")
            yield records
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)  # the worker writes `out`, then exits
                try:
                    await asyncio.wait_for(proc.wait(), 15)
                except TimeoutError:
                    _kill(proc)
                    await proc.wait()
            loaded = Records.load(out)
            records.starts, records.refs = loaded.starts, loaded.refs


class NodePeer(Peer):
    """A Node.js peer: its npm package installed under `<tmp>/<name>`, driven by `script`."""

    script: str

    def __init__(self, server: Server, tmp: Path, cpu: ServerCpu | None = None):
        super().__init__(server, tmp, cpu)
        self.env = {"NODE_PATH": str(tmp / self.name / "node_modules")}

    def argv(self) -> list[str]:
        return ["node", str(HERE / self.script)]


class GraphileWorker(NodePeer):
    name = "graphile-worker"
    script = "graphile_worker_peer.cjs"
    queued_sql = (
        "SELECT EXISTS (SELECT 1 FROM graphile_worker._private_jobs WHERE locked_at IS NULL)"
    )
    done_sql = "SELECT NOT EXISTS (SELECT 1 FROM graphile_worker._private_jobs)"
    remaining_sql = "SELECT count(*) FROM graphile_worker._private_jobs"


class PgBoss(NodePeer):
    name = "pg-boss"
    script = "pg_boss_peer.cjs"
    queued_sql = "SELECT EXISTS (SELECT 1 FROM pgboss.job WHERE name = 'noop' AND state < 'active')"
    done_sql = (
        "SELECT NOT EXISTS (SELECT 1 FROM pgboss.job WHERE name = 'noop' AND state < 'completed')"
    )
    remaining_sql = "SELECT count(*) FROM pgboss.job WHERE name = 'noop' AND state < 'completed'"


class Procrastinate(Peer):
    name = "procrastinate"
    queued_sql = (
        "SELECT EXISTS (SELECT 1 FROM procrastinate_jobs WHERE status IN ('todo', 'doing'))"
    )
    done_sql = "SELECT NOT " + queued_sql.removeprefix("SELECT ")
    remaining_sql = "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
    env: dict[str, str] = {}

    def argv(self) -> list[str]:
        return [
            str(self.tmp / "procrastinate-venv" / "bin" / "python"),
            str(HERE / "procrastinate_peer.py"),
        ]


async def _communicate(proc: asyncio.subprocess.Process, timeout_s: float) -> bytes | None:
    """The process's output, or None when it ran past `timeout_s` (then it is killed)."""
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        _kill(proc)
        await proc.wait()
        return None
    return out


def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the process and its children


def _tail(log: Path, tmp: Path, chars: int = 600) -> str:
    text = log.read_text(errors="replace")[-chars:] if log.exists() else ""
    return " ".join(text.replace(str(tmp), "<tmp>").split())


# installing the peers ---------------------------------------------------------------------
async def _run(argv: list[str], timeout_s: float, cwd: Path) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    out = await _communicate(proc, timeout_s)
    if out is None:
        return -1, f"timed out after {timeout_s:.0f} s"
    return proc.returncode or 0, out.decode(errors="replace")


async def install(name: str, tmp: Path) -> str:
    """Install one peer under `tmp`; return its version (raise Failed with npm's/pip's error)."""
    if name in ("graphile-worker", "pg-boss"):
        prefix = tmp / name
        if not (prefix / "node_modules" / name / "package.json").exists():
            spec = GRAPHILE_SPEC if name == "graphile-worker" else PG_BOSS_SPEC
            code, out = await _run(
                [
                    "npm",
                    "install",
                    "--prefix",
                    str(prefix),
                    spec,
                    "--no-audit",
                    "--no-fund",
                    "--loglevel=error",
                ],
                600,
                tmp,
            )
            if code != 0:
                raise Failed(f"npm install {spec} failed ({code}): {out[-1500:]}")
        package = json.loads((prefix / "node_modules" / name / "package.json").read_text())
        return str(package["version"])
    venv = tmp / "procrastinate-venv"
    python = venv / "bin" / "python"
    if not python.exists():
        code, out = await _run([sys.executable, "-m", "venv", str(venv)], 300, tmp)
        if code != 0:
            raise Failed(f"python -m venv failed ({code}): {out[-1500:]}")
    code, out = await _run([str(python), "-c", "import procrastinate"], 60, tmp)
    if code != 0:
        code, out = await _run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                *PROCRASTINATE_SPECS,
            ],
            600,
            tmp,
        )
        if code != 0:
            raise Failed(
                f"pip install {' '.join(PROCRASTINATE_SPECS)} failed ({code}): {out[-1500:]}"
            )
    code, out = await _run(
        [
            str(python),
            "-c",
            "import importlib.metadata as m; "
            "print(m.version('procrastinate'), m.version('psycopg'))",
        ],
        60,
        tmp,
    )
    version, psycopg = out.split()
    return f"{version} (psycopg {psycopg})"


# measuring --------------------------------------------------------------------------------
async def wait_done(dsn: str, system: System, timeout_s: float, n: int) -> float:
    """Poll the database until no job is unfinished; return the wall time it was seen. Every
    50 ms while jobs wait to start, then every 10 ms (only the tail is timed this finely)."""
    conn = await asyncpg.connect(dsn)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not await conn.fetchval(system.queued_sql):
                break
            await asyncio.sleep(0.05)
        while time.monotonic() < deadline:
            if await conn.fetchval(system.done_sql):
                return time.time()
            await asyncio.sleep(0.01)
        left = await conn.fetchval(system.remaining_sql)
    finally:
        await conn.close()
    raise CannotKeepUp(f"{left:,} of {n:,} jobs unfinished after {timeout_s:.0f} s")


async def vacuum(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()


async def quiet(sizes: Sizes) -> float:
    return await wait_for_quiet(sizes.quiet_s) if sizes.quiet_s > 0 else float("nan")


async def w1_enqueue(system: System, sizes: Sizes) -> dict[str, float]:
    figures: dict[str, float] = {}
    async with system.database() as dsn:
        await quiet(sizes)
        async with system.pg_cpu(figures, "pg_cpu_bulk", sizes.bulk):
            bulk = await system.bulk(dsn, sizes.bulk)
        await quiet(sizes)
        one = await system.single(dsn, sizes.single, sizes.clients)
    return {
        "enqueue_bulk": bulk["n"] / bulk["elapsed_s"],
        "enqueue_single": one["n"] / one["elapsed_s"],
        **figures,
    }


async def w2_drain(system: System, sizes: Sizes) -> dict[str, float]:
    n = sizes.drain
    async with system.database() as dsn:
        await system.bulk(dsn, n)
        await vacuum(dsn)
        await quiet(sizes)
        figures: dict[str, float] = {}
        # the worker's start and stop are inside: each system's own cost of a drain
        async with system.pg_cpu(figures, "pg_cpu_drain", n), system.worker(dsn) as records:
            done = await wait_done(dsn, system, 150, n)
    started = len(records.starts)
    if started < n:
        raise Failed(f"only {started:,} of {n:,} handler starts recorded")
    return {"drain": n / (done - min(records.starts)), **figures, **records.memory()}


async def warm_up(system: System, dsn: str) -> None:
    """A few jobs through the running worker, so it has connected and prepared."""
    await system.single(dsn, WARMUP_JOBS, 1)
    await wait_done(dsn, system, 60, WARMUP_JOBS)


async def w3_latency(system: System, sizes: Sizes) -> dict[str, float]:
    n = round(sizes.rate * sizes.seconds)
    async with system.database() as dsn, system.worker(dsn) as records:
        await warm_up(system, dsn)
        await quiet(sizes)
        t0 = time.time()
        sent = await system.paced(dsn, sizes.rate, sizes.seconds)
        await wait_done(dsn, system, 60, n)
    latencies = [
        s - r
        for s, r in zip(records.starts, records.refs, strict=True)
        if r is not None and r >= t0
    ]
    if len(latencies) < n:
        raise Failed(f"only {len(latencies):,} of {n:,} latencies recorded")
    result = {f"latency_p{q}": percentile(latencies, q / 100) * 1000 for q in (50, 95, 99)}
    return {**result, "_rate_sent": sent.get("rate", float("nan")), **records.memory()}


async def w4_burst(system: System, sizes: Sizes) -> dict[str, float]:
    n = sizes.burst
    async with system.database() as dsn, system.worker(dsn) as records:
        await warm_up(system, dsn)
        await quiet(sizes)
        instant = time.time() + sizes.lead_s
        enqueued = await system.bulk(dsn, n, run_at=instant)
        done = await wait_done(dsn, system, sizes.lead_s + 90, n)
    starts = [
        s
        for s, r in zip(records.starts, records.refs, strict=True)
        if r is not None and abs(r - instant) < 0.002
    ]
    if len(starts) < n:
        raise Failed(f"only {len(starts):,} of {n:,} burst starts recorded")
    return {
        "burst_last_start": (max(starts) - instant) * 1000,
        "burst_last_finish": (done - instant) * 1000,
        "_first_start_ms": (min(starts) - instant) * 1000,
        "_enqueue_done_before_T_s": instant - enqueued.get("finished_at", instant),
        **records.memory(),
    }


WORKLOADS: dict[str, Callable[[System, Sizes], Awaitable[dict[str, float]]]] = {
    "W1": w1_enqueue,
    "W2": w2_drain,
    "W3": w3_latency,
    "W4": w4_burst,
}
# a last-resort bound on a whole workload (each step inside has its own)
WORKLOAD_BOUND_S = {"W1": 600, "W2": 300, "W3": 180, "W4": 240}


# the run ----------------------------------------------------------------------------------
@dataclass
class Cell:
    """One system's figures for one metric over the repetitions."""

    runs: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def median(self) -> float | None:
        return statistics.median(self.runs) if self.runs else None


async def run_workload(
    system: System,
    workload: str,
    sizes: Sizes,
    cells: dict[str, dict[str, Cell]],
    extras: dict[str, Any],
) -> None:
    t0 = time.monotonic()
    try:
        figures = await asyncio.wait_for(
            WORKLOADS[workload](system, sizes), WORKLOAD_BOUND_S[workload]
        )
    except (CannotKeepUp, TimeoutError) as exc:
        problem = f"{system.name} cannot keep up ({workload}): {exc or 'workload bound hit'}"
    except Failed as exc:
        problem = f"{system.name} failed ({workload}): {exc}"
    except Exception as exc:  # reported, and the run goes on with the next workload
        problem = f"{system.name} failed ({workload}): {type(exc).__name__}: {exc}"
    else:
        for key, value in figures.items():
            if key.startswith("_"):
                extras.setdefault(system.name, {}).setdefault(workload + key, []).append(
                    round(value, 3)
                )
            else:
                cells[key][system.name].runs.append(value)
        shown = ", ".join(f"{k} {v:,.1f}" for k, v in figures.items() if not k.startswith("_"))
        print(
            f"  {system.name:15} {workload}: {shown}  ({time.monotonic() - t0:.0f} s)", flush=True
        )
        return
    problem = problem.replace(str(system.tmp), "<tmp>")
    print(f"  {system.name:15} {workload}: {problem}", flush=True)
    for key in WORKLOAD_METRICS[workload]:
        cells[key][system.name].problems.append(problem)


def fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}"


def print_table(cells: dict[str, dict[str, Cell]], systems: list[str], reps: int) -> None:
    header = ["workload", "unit", *systems]
    rows = [header]
    for m in METRICS:
        row = [m.label, m.unit]
        base = cells[m.key].get("dispatcher")
        for s in systems:
            cell = cells[m.key][s]
            if cell.median is None:
                row.append(
                    "timeout"
                    if any("keep up" in p for p in cell.problems)
                    else "failed"
                    if cell.problems
                    else "-"
                )
                continue
            text = fmt(cell.median)
            if s != "dispatcher" and base is not None and base.median:
                text += f" ({cell.median / base.median:.2f}x)"
            if cell.problems:
                text += "*"
            row.append(text)
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    print(f"\n== peers: median of {reps} repetition(s); (Nx) = system / dispatcher ==")
    for i, row in enumerate(rows):
        print(
            "  ".join(
                c.rjust(w) if j >= 2 else c.ljust(w)
                for j, (c, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
        )
        if i == 0:
            print("  ".join("-" * w for w in widths))
    notes = sorted({p for m in METRICS for s in systems for p in cells[m.key][s].problems})
    for note in notes:
        print(f"  * {note}")


def save(path: Path, report: dict[str, Any]) -> None:
    RESULTS_DIR.mkdir(exist_ok=True)
    path.write_text(json.dumps(report, indent=1, default=str) + "\n")


async def main(args: argparse.Namespace) -> int:
    sizes = QUICK if args.quick else FULL
    if args.repetitions:
        sizes = dataclasses.replace(sizes, repetitions=args.repetitions)
    systems = [s for s in SYSTEMS if s in args.systems.split(",")]
    for item in args.setting:
        target, _, value = item.partition("=")
        system, _, key = target.partition(".")
        if system not in SETTINGS or system == "dispatcher" or key not in SETTINGS[system]:
            raise SystemExit(f"--setting {item}: no such peer setting")
        SETTINGS[system][key] = type(SETTINGS[system][key])(value)
    started = time.monotonic()
    tmp = Path(args.peers_dir) if args.peers_dir else Path(tempfile.mkdtemp(prefix="peers-"))
    tmp.mkdir(parents=True, exist_ok=True)
    server = await Server().open()
    try:
        version, settings = await server.describe()
        machine = machine_info(version, settings)
        machine["server"] = server.origin
        print(describe_machine(machine))
        print(f"mode: {'quick' if args.quick else 'full'}, {sizes.repetitions} repetition(s)")

        versions: dict[str, str] = {"dispatcher": machine["dispatcher_commit"]}
        blocked: dict[str, str] = {}
        peers = [s for s in systems if s != "dispatcher"]
        print(
            f"installing {', '.join(peers) or 'no peers'} into a temporary folder ...", flush=True
        )
        outcomes = await asyncio.gather(*(install(p, tmp) for p in peers), return_exceptions=True)
        for peer, outcome in zip(peers, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                blocked[peer] = str(outcome).replace(str(tmp), "<tmp>")
                print(f"  {peer}: BLOCKED: {blocked[peer]}")
            else:
                versions[peer] = outcome
                print(f"  {peer} {outcome}")
        print(f"  ({time.monotonic() - started:.0f} s)", flush=True)

        kinds = {
            "dispatcher": Dispatcher,
            "graphile-worker": GraphileWorker,
            "pg-boss": PgBoss,
            "procrastinate": Procrastinate,
        }
        cpu = await ServerCpu.of(server.url)
        if cpu is None:
            print("PostgreSQL's processes are not readable here: no CPU per job figures")
        runnable = [kinds[s](server, tmp, cpu) for s in systems if s not in blocked]
        cells = {m.key: {s: Cell() for s in systems} for m in METRICS}
        extras: dict[str, Any] = {}
        for s, why in blocked.items():
            for m in METRICS:
                cells[m.key][s].problems.append(f"{s} blocked: {why[:300]}")
        workloads = args.workloads.split(",")
        for rep in range(sizes.repetitions):
            print(
                f"\nrepetition {rep + 1} of {sizes.repetitions} "
                f"({time.monotonic() - started:.0f} s so far)",
                flush=True,
            )
            order = runnable[rep % len(runnable) :] + runnable[: rep % len(runnable)]
            for system in order:
                for workload in workloads:
                    await run_workload(system, workload, sizes, cells, extras)

        for s in systems:  # one job's whole life: the medians of its two workloads
            bulk, drain = cells["pg_cpu_bulk"][s].median, cells["pg_cpu_drain"][s].median
            if bulk is not None and drain is not None:
                cells["pg_cpu_lifecycle"][s].runs.append(bulk + drain)
        print_table(cells, systems, sizes.repetitions)
        report = {
            "benchmark": "peers",
            "mode": "quick" if args.quick else "full",
            "repetitions": sizes.repetitions,
            "sizes": vars(sizes),
            "machine": machine,
            "versions": versions,
            "settings": {s: SETTINGS[s] for s in systems},
            "metrics": [
                {
                    "metric": m.key,
                    "label": m.label,
                    "unit": m.unit,
                    "better": "higher" if m.higher_is_better else "lower",
                    "systems": {
                        s: {
                            "median": cells[m.key][s].median,
                            "runs": [round(v, 3) for v in cells[m.key][s].runs],
                            "ratio_to_dispatcher": (
                                cells[m.key][s].median / cells[m.key]["dispatcher"].median
                                if "dispatcher" in systems
                                and cells[m.key][s].median is not None
                                and cells[m.key]["dispatcher"].median
                                else None
                            ),
                            "problems": sorted(set(cells[m.key][s].problems)),
                        }
                        for s in systems
                    },
                }
                for m in METRICS
            ],
            "extras": extras,
            "wall_s": round(time.monotonic() - started),
        }
        if args.output:
            path = Path(args.output)
        elif set(workloads) == set(WORKLOADS) and systems == list(SYSTEMS):
            path = RESULTS_DIR / "peers.json"
        else:
            path = None  # a partial run does not replace the results file
        if path is not None:
            save(path, report)
            shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            print(f"\nresults written to {shown}")
        print(f"total {time.monotonic() - started:.0f} s")
        return 0
    finally:
        server.close()
        if not args.peers_dir:
            shutil.rmtree(tmp, ignore_errors=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: 1 repetition, smaller counts"
    )
    parser.add_argument("--repetitions", type=int, default=0, help="override the repetitions")
    parser.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help="comma-separated subset of " + ",".join(SYSTEMS),
    )
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="comma-separated subset of W1,W2,W3,W4"
    )
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="SYSTEM.KEY=VALUE",
        help="override one of a peer's settings, e.g. pg-boss.workers=16 (repeatable)",
    )
    parser.add_argument(
        "--peers-dir",
        default="",
        help="install the peers here and keep them (default: a temporary "
        "folder, removed at the end)",
    )
    parser.add_argument(
        "--output",
        default="",
        help="results file (default tests/bench/results/peers.json, written "
        "only by a run of every system and workload)",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(run(lambda: main(parse_args())))
