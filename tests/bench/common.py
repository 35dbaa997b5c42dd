"""Shared helpers of the benchmarks: a throw-away database, the daemon as a child process,
CPU accounting, figures with targets, the printed table and the JSON results file.

Every benchmark runs against a fresh database (`bench_<pid>_<n>`) on the server named by
`DATABASE_URL`, else the local PostgreSQL on 127.0.0.1:5432, else an embedded PostgreSQL; the
database is dropped at the end. The database clock is the reference for every latency.

Environment: BENCH_QUIET_WAIT_S bounds the wait for an idle machine before each workload
(default 30 s; the "others" CPU figure shows load from other users when it never came);
BENCH_PATCHES runs the daemon with candidate fixes (see tests/bench/experiment.py), results
then go to results/<name>-experiment.json; BENCH_KEEP_LOGS keeps the daemon's log files.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import asyncpg

from tests.harness import DaemonProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = Path(__file__).parent / "results"
LOCAL_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"

# Queue limits raised so the limiter never binds: the benchmarks measure the engine itself.
UNLIMITED_QUEUE_ENV = {
    "DISPATCHER_QUEUES__DEFAULT__RATE_PER_S": "1000000",
    "DISPATCHER_QUEUES__DEFAULT__BURST": "100000",
    "DISPATCHER_QUEUES__DEFAULT__MAX_INFLIGHT": "2000",
    "DISPATCHER_QUEUES__DEFAULT__CLAIM_BATCH": "1000",
}
NOOP_HANDLER_ENV = {
    "DISPATCHER_HANDLERS__NOOP__KIND": "python",
    "DISPATCHER_HANDLERS__NOOP__FUNCTION": "tests.bench.handlers:noop",
    "DISPATCHER_HANDLERS__NOOP__TRANSACTIONAL": "false",
}
LOOPBACK_HTTP_ENV = {
    "DISPATCHER_TARGET_ALLOW_HTTP": "true",
    "DISPATCHER_TARGET_ALLOW_CIDRS": "127.0.0.0/8",
}


# figures ----------------------------------------------------------------------------------
@dataclass
class Figure:
    """One measured number, with its target when it has one (`at_least` or `at_most`)."""

    workload: str
    value: float
    unit: str
    at_least: float | None = None
    at_most: float | None = None
    note: str = ""

    @property
    def target(self) -> str:
        if self.at_least is not None:
            return f">= {_num(self.at_least)}"
        if self.at_most is not None:
            return f"<= {_num(self.at_most)}"
        return ""

    @property
    def met(self) -> bool | None:
        if self.at_least is not None:
            return self.value >= self.at_least
        if self.at_most is not None:
            return self.value <= self.at_most
        return None

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "target": self.target, "met": self.met}


def _num(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.4g}"


def print_table(title: str, figures: Iterable[Figure]) -> None:
    rows = [("workload", "figure", "unit", "target", "met?", "note")]
    for f in figures:
        met = {True: "yes", False: "NO", None: "-"}[f.met]
        rows.append((f.workload, _num(f.value), f.unit, f.target or "-", met, f.note))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print(f"\n== {title} ==")
    for n, row in enumerate(rows):
        cells = [
            c.rjust(w) if i == 1 else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        print("  ".join(cells).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


def save_results(
    name: str, machine: dict[str, Any], figures: list[Figure], extra: dict[str, Any] | None = None
) -> Path:
    """Append this run to `results/<name>.json` (a JSON list, one object per run); runs with
    BENCH_PATCHES (experiments) go to `results/<name>-experiment.json`."""
    RESULTS_DIR.mkdir(exist_ok=True)
    suffix = "-experiment" if os.environ.get("BENCH_PATCHES") else ""
    path = RESULTS_DIR / f"{name}{suffix}.json"
    runs: list[Any] = []
    if path.exists():
        with contextlib.suppress(ValueError):
            runs = json.loads(path.read_text())
    runs.append(
        {
            "benchmark": name,
            "machine": machine,
            "figures": [f.as_json() for f in figures],
            **(extra or {}),
        }
    )
    path.write_text(json.dumps(runs, indent=1, default=str) + "\n")
    return path


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


# machine ----------------------------------------------------------------------------------
def machine_info(server_version: str, settings: dict[str, str]) -> dict[str, Any]:
    meminfo = Path("/proc/meminfo").read_text()
    mem_kb = int(re.search(r"MemTotal:\s+(\d+)", meminfo).group(1))  # type: ignore[union-attr]
    cpu = re.search(r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text())
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "dispatcher"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": cpu.group(1).strip() if cpu else platform.processor(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "postgresql": server_version,
        "pg_settings": settings,
        "python": platform.python_version(),
        "dispatcher_commit": commit + ("+dirty" if dirty else ""),
        "loadavg_at_start": os.getloadavg()[0],
        "experiment_patches": os.environ.get("BENCH_PATCHES") or None,
    }


def describe_machine(m: dict[str, Any]) -> str:
    s = ", ".join(f"{k}={v}" for k, v in m["pg_settings"].items())
    return (
        f"machine: {m['nproc']} CPUs ({m['cpu']}), {m['memory_gib']} GiB RAM, "
        f"load {m['loadavg_at_start']:.2f} at start; {m['postgresql']} ({s}); "
        f"Python {m['python']}; dispatcher {m['dispatcher_commit']}"
        + (f"; EXPERIMENT patches {m['experiment_patches']}" if m["experiment_patches"] else "")
    )


# database ---------------------------------------------------------------------------------
class Server:
    """The PostgreSQL server the benchmarks use; `database(name)` gives a URL on it."""

    def __init__(self) -> None:
        self.url = ""
        self.origin = ""
        self._embedded: Any = None
        self._tmp: str | None = None
        self._counter = 0

    async def open(self) -> Server:
        for url in [os.environ.get("DATABASE_URL") or LOCAL_SERVER]:
            try:
                conn = await asyncpg.connect(url, timeout=3)
            except (TimeoutError, OSError, asyncpg.PostgresError):
                continue
            await conn.close()
            self.url, self.origin = url, url.split("@")[-1]
            return self
        from dispatcher.db.embedded import EmbeddedPostgres  # the fallback, in a temporary dir

        self._tmp = tempfile.mkdtemp(prefix="bench-pg-")
        self._embedded = EmbeddedPostgres(Path(self._tmp))
        self.url, self.origin = self._embedded.start(), "embedded PostgreSQL"
        return self

    def close(self) -> None:
        if self._embedded is not None:
            self._embedded.stop()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def database_url(self, name: str) -> str:
        parts = urlsplit(self.url)
        return urlunsplit(parts._replace(path="/" + name))

    async def describe(self) -> tuple[str, dict[str, str]]:
        conn = await asyncpg.connect(self.url)
        try:
            version = await conn.fetchval("SELECT split_part(version(), ' on ', 1)")
            settings = {
                name: await conn.fetchval(f"SHOW {name}")
                for name in ("synchronous_commit", "fsync", "shared_buffers", "max_connections")
            }
        finally:
            await conn.close()
        return version, settings

    @contextlib.asynccontextmanager
    async def database(self, migrate: bool = True, keep: str = "") -> AsyncIterator[str]:
        """A fresh database (migrated with `dispatcher migrate`), dropped on exit; with `keep`,
        the database of that name, created (and migrated) only if missing and never dropped."""
        self._counter += 1
        name = keep or f"bench_{os.getpid()}_{self._counter}"
        admin = await asyncpg.connect(self.url)
        try:
            exists = await admin.fetchval("SELECT true FROM pg_database WHERE datname = $1", name)
            if not (keep and exists):
                await admin.execute(f"CREATE DATABASE {name}")
        finally:
            await admin.close()
        dsn = self.database_url(name)
        try:
            if migrate and not (keep and exists):
                run_migrate(dsn)
                await apply_sql_patches(dsn)
            yield dsn
        finally:
            if not keep:
                admin = await asyncpg.connect(self.url)
                try:
                    await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
                finally:
                    await admin.close()


# Candidate fixes to the SQL door, applied to the throw-away database only (BENCH_PATCHES).
SQL_PATCHES = {
    # the same key rule without a bounded-repetition regex (slow to match in PostgreSQL)
    "fastkey": (
        "k IS NULL OR k !~ '^[ -~]{1,255}$'",
        "k IS NULL OR k ~ '[^ -~]' OR length(k) NOT BETWEEN 1 AND 255",
    ),
}


# Candidate fixes applied as statements to the throw-away database (BENCH_PATCHES).
SQL_STATEMENT_PATCHES = {
    # no NOTIFY from intake even while a daemon listens (the wake gate already sends none when
    # nobody does): NOTIFY takes a database-wide lock held through the commit's WAL flush, so
    # enqueueing transactions that notify commit one after another. The ceiling of any
    # coalescing of wake-ups; jobs then start only by the work poll
    "nonotify": (
        "CREATE OR REPLACE FUNCTION dispatcher.wake(reason text DEFAULT '') RETURNS void"
        " LANGUAGE sql AS 'SELECT NULL::void';"
        " CREATE OR REPLACE FUNCTION dispatcher.wake_queue(queue text) RETURNS void"
        " LANGUAGE sql AS 'SELECT NULL::void'"
    ),
    # a generic plan of enqueue_many's statement assumes tiny arrays and turns quadratic
    "enqcustom": (
        "ALTER FUNCTION dispatcher.enqueue_many_internal SET plan_cache_mode = force_custom_plan"
    ),
}


async def apply_sql_patches(dsn: str) -> None:
    patches = os.environ.get("BENCH_PATCHES", "").split(",")
    wanted = [p for p in patches if p in SQL_PATCHES]
    statements = [SQL_STATEMENT_PATCHES[p] for p in patches if p in SQL_STATEMENT_PATCHES]
    if not wanted and not statements:
        return
    conn = await asyncpg.connect(dsn)
    try:
        for statement in statements:
            await conn.execute(statement)
        body = await conn.fetchval(
            "SELECT pg_get_functiondef('dispatcher.enqueue_many_internal'::regproc)"
        )
        for patch in wanted:
            old, new = SQL_PATCHES[patch]
            if old not in body:  # the product changed: the fix may already be in
                print(f"  (SQL patch {patch} does not apply to this enqueue_many: skipped)")
                continue
            body = body.replace(old, new)
        await conn.execute(body)
    finally:
        await conn.close()


def db_name(dsn: str) -> str:
    return urlsplit(dsn).path.lstrip("/")


def run_migrate(dsn: str) -> None:
    env = {**os.environ, "DISPATCHER_DATABASE_URL": dsn, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "dispatcher.cli", "migrate"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"dispatcher migrate failed: {done.stderr[-2000:]}")


async def register_handler(dsn: str, name: str, kind: str = "python") -> None:
    """The SQL door only accepts known handlers; the daemon registers its own at start, so a
    benchmark that enqueues before starting the daemon registers the handler itself."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "INSERT INTO dispatcher.handlers (name, kind) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            name,
            kind,
        )
    finally:
        await conn.close()


async def wait_for(
    predicate: Callable[[], Awaitable[bool]],
    timeout_s: float,
    interval_s: float = 0.05,
    what: str = "condition",
) -> float:
    """Poll until true; return the monotonic time it was first seen true."""
    deadline = time.monotonic() + timeout_s
    while True:
        if await predicate():
            return time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(interval_s)


async def count_state(conn: asyncpg.Connection, state: str) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM dispatcher.jobs WHERE state = $1", state))


# processes --------------------------------------------------------------------------------
@contextlib.asynccontextmanager
async def daemon(
    dsn: str, env: dict[str, str], *, wait_ready: bool = True
) -> AsyncIterator[DaemonProcess]:
    """`dispatcher run` as a child process on `dsn`; SIGTERM (then SIGKILL) on exit.

    With BENCH_PATCHES set, the daemon runs through `tests.bench.experiment` with those
    candidate fixes applied (and `count` call counts are printed when it stops)."""
    proc = DaemonProcess({"DISPATCHER_DATABASE_URL": dsn, "PYTHONPATH": str(ROOT), **env})
    if os.environ.get("BENCH_PATCHES"):
        proc.argv = [sys.executable, "-m", "tests.bench.experiment", "run"]
    await proc.start(wait_ready=wait_ready)
    try:
        yield proc
    finally:
        try:
            await proc.stop()
        except TimeoutError:
            assert proc.proc is not None
            proc.proc.kill()
            await proc.proc.wait()
        errors = [
            line
            for line in proc.log_text().splitlines()
            if '"ERROR"' in line or "Traceback" in line
        ]
        if errors:
            print(f"  daemon logged {len(errors)} error lines, first: {errors[0][:300]}")
        for line in proc.log_text().splitlines():
            if line.startswith("bench-counts "):
                counts = json.loads(line.split(" ", 1)[1])
                print(
                    "  repository calls (count, total s): "
                    + ", ".join(f"{k} {v[0]} {v[1]:.2f}" for k, v in sorted(counts.items()))
                )
            if line.startswith("bench-stages "):  # ms after the due time: median, p95
                print("  stages (ms after due: median, p95): " + line.split(" ", 1)[1])
        if os.environ.get("BENCH_KEEP_LOGS"):
            print(f"  daemon log kept: {proc.log_path}")
        else:
            proc.log_path.unlink(missing_ok=True)


@contextlib.asynccontextmanager
async def target_process() -> AsyncIterator[tuple[str, int]]:
    """A fast loopback HTTP target (aiohttp on uvloop) in its own process; yields (url, pid)."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.bench.target_server",
        str(port),
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/hook"

    async def up() -> bool:
        try:
            async with aiohttp.ClientSession() as s, s.post(url, json={}) as r:
                return r.status == 200
        except aiohttp.ClientError:
            return False

    try:
        await wait_for(up, 20, what="target server")
        yield url, proc.pid
    finally:
        proc.terminate()
        await proc.wait()


def proc_stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state, ppid, ..., utime at 11,
    stime 12, cutime 13, cstime 14), or None when the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


class CpuMeter:
    """CPU use over an interval, in % of one core: named processes, the PostgreSQL backends
    serving `database`, and everything else on the machine ("others": other users' load, which
    makes a figure unreliable when large)."""

    def __init__(self, pids: dict[str, int], database: str | None = None):
        self.pids = pids
        self.database = database
        self._tick = os.sysconf("SC_CLK_TCK")
        self._ncpu = os.cpu_count() or 1

    @staticmethod
    def _machine() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
        idle = fields[3] + fields[4]
        return sum(fields) - idle, sum(fields)

    @staticmethod
    def _proc(pid: int) -> int:
        parts = proc_stat(pid)
        return int(parts[11]) + int(parts[12]) if parts else 0  # utime + stime, in ticks

    def _backends(self) -> dict[int, int]:
        if not self.database:
            return {}
        found = {}
        needle = f" {self.database} ".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                title = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if title.startswith(b"postgres: ") and needle in title:
                found[int(entry.name)] = self._proc(int(entry.name))
        return found

    async def __aenter__(self) -> CpuMeter:
        self._t0 = time.monotonic()
        self._m0 = self._machine()
        self._p0 = {n: self._proc(p) for n, p in self.pids.items()}
        self._b0 = self._backends()
        self._seen: dict[int, int] = {}
        self._watcher = asyncio.create_task(self._watch())
        return self

    async def _watch(self) -> None:
        """Backends that come and go inside the interval (pgbench's) are sampled here."""
        while self.database:
            self._seen.update(self._backends())
            await asyncio.sleep(0.25)

    async def __aexit__(self, *exc: object) -> None:
        self._watcher.cancel()
        wall = max(time.monotonic() - self._t0, 1e-9)
        b1 = {**self._seen, **self._backends()}
        busy1, total1 = self._machine()
        per_core = 100.0 / self._tick / wall
        self.wall_s = wall
        # whole machine, as % of one core (200% = both cores of a 2-CPU machine busy)
        self.machine_pct = self._ncpu * 100.0 * (busy1 - self._m0[0]) / max(1, total1 - self._m0[1])
        self.process_pct = {
            n: (self._proc(p) - self._p0[n]) * per_core for n, p in self.pids.items()
        }
        if self.database:
            self.process_pct["postgres"] = (
                sum(t - self._b0.get(pid, 0) for pid, t in b1.items()) * per_core
            )
        self.others_pct = max(0.0, self.machine_pct - sum(self.process_pct.values()))
        self.peak_rss_mb = {n: peak_rss_mb(p) for n, p in self.pids.items()}

    def summary(self) -> str:
        procs = ", ".join(f"{n} {v:.0f}%" for n, v in self.process_pct.items())
        peaks = ", ".join(f"{n} {v:.0f} MB" for n, v in self.peak_rss_mb.items() if v)
        return (
            f"cpu %core: machine {self.machine_pct:.0f}/{self._ncpu * 100}"
            + (f", {procs}" if procs else "")
            + f", others {self.others_pct:.0f}"
            + (f"; peak RSS since start: {peaks}" if peaks else "")
        )

    def cpu_s(self, name: str) -> float:
        """CPU seconds `name` used over the interval."""
        return self.process_pct.get(name, 0.0) / 100.0 * self.wall_s

    def as_json(self) -> dict[str, float]:
        return {
            "machine": self.machine_pct,
            **self.process_pct,
            "others": self.others_pct,
            "wall_s": self.wall_s,
            **{f"{n}_peak_rss_mb": v for n, v in self.peak_rss_mb.items()},
        }


class ServerCpu:
    """PostgreSQL's own CPU seconds, every process of the server: the postmaster, each live
    child (backends, WAL writer, checkpointer, autovacuum) and every child it has reaped, whose
    time the kernel adds to the postmaster's `cutime`/`cstime`. Unlike sampling backends, a
    connection that opens and closes between two samples is counted whole. Only for a server on
    this machine, readable in /proc (a private cluster: another database's load counts too)."""

    def __init__(self, postmaster: int):
        self.postmaster = postmaster
        self._tick = os.sysconf("SC_CLK_TCK")

    @classmethod
    async def of(cls, dsn: str) -> ServerCpu | None:
        """The meter of the server behind `dsn`, or None when its processes are not readable."""
        conn = await asyncpg.connect(dsn)
        try:
            fields = proc_stat(await conn.fetchval("SELECT pg_backend_pid()"))  # while it lives
        finally:
            await conn.close()
        return cls(int(fields[1])) if fields else None  # the backend's parent: the postmaster

    def seconds(self) -> float:
        ticks = 0
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            fields = proc_stat(entry.name)
            if fields is None:
                continue  # gone meanwhile: reaped, so counted in the postmaster's children
            pid, parent = int(entry.name), int(fields[1])
            if pid == self.postmaster:
                ticks += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
            elif parent == self.postmaster:
                ticks += int(fields[11]) + int(fields[12])
        return ticks / self._tick


def peak_rss_mb(pid: int) -> float:
    """The process's highest resident set size since it started (VmHWM), in MiB; 0 if gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def machine_busy_pct(seconds: float = 1.0) -> float:
    busy0, total0 = CpuMeter._machine()
    await asyncio.sleep(seconds)
    busy1, total1 = CpuMeter._machine()
    return 100.0 * (busy1 - busy0) / max(1, total1 - total0)


async def wait_for_quiet(max_wait_s: float = 60.0, busy_below_pct: float = 15.0) -> float:
    """Wait (bounded) until the machine is nearly idle, so other users' load does not skew the
    next workload; return the busy % last seen (printed when the machine never quietened).
    BENCH_QUIET_WAIT_S overrides the bound (0: do not wait)."""
    max_wait_s = float(os.environ.get("BENCH_QUIET_WAIT_S", max_wait_s))
    deadline = time.monotonic() + max_wait_s
    quiet = 0
    busy = 100.0
    while time.monotonic() < deadline:
        busy = await machine_busy_pct(0.5)
        quiet = quiet + 1 if busy < busy_below_pct else 0
        if quiet >= 2:
            return busy
    print(
        f"  (machine still {busy:.0f}% busy after waiting {max_wait_s:.0f} s for quiet; "
        "figures may be low)",
        flush=True,
    )
    return busy


# metrics ----------------------------------------------------------------------------------
async def histogram(base_url: str, name: str, labels: str = "") -> dict[float, float]:
    """Cumulative bucket counts {le: count} of a Prometheus histogram from /metrics."""
    async with aiohttp.ClientSession() as s, s.get(f"{base_url}/metrics") as r:
        text = await r.text()
    buckets: dict[float, float] = {}
    pattern = re.compile(rf"^{name}_bucket\{{(.*?)\}} ([0-9.e+-]+)$", re.M)
    for match in pattern.finditer(text):
        label_text, value = match.groups()
        if labels and labels not in label_text:
            continue
        le = re.search(r'le="([^"]+)"', label_text).group(1)  # type: ignore[union-attr]
        buckets[float("inf") if le == "+Inf" else float(le)] = float(value)
    return buckets


def histogram_quantile(q: float, before: dict[float, float], after: dict[float, float]) -> float:
    """Prometheus-style quantile (linear within the bucket) of the observations in between."""
    edges = sorted(after)
    counts = [after[e] - before.get(e, 0.0) for e in edges]
    if not counts or counts[-1] <= 0:
        return float("nan")
    rank = q * counts[-1]
    prev_edge, prev_count = 0.0, 0.0
    for edge, count in zip(edges, counts, strict=True):
        if count >= rank:
            if edge == float("inf"):
                return prev_edge
            span = count - prev_count
            return prev_edge + (edge - prev_edge) * ((rank - prev_count) / span if span else 1)
        prev_edge, prev_count = edge, count
    return edges[-1]


def environment_only(doc: str | None) -> None:
    """For a benchmark configured by its environment alone: `--help` prints its description
    (which names the variables it reads) and exits; any argument is refused, so a mistyped
    option never starts a run of minutes."""
    argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()


def run(main: Callable[[], Awaitable[Any]]) -> Any:
    """Run a benchmark's main coroutine on uvloop (as the daemon does)."""
    try:
        import uvloop

        return uvloop.run(main())
    except ImportError:  # pragma: no cover
        return asyncio.run(main())


@dataclass
class Bench:
    """What a benchmark run collects: the server, the machine, the figures, the details."""

    name: str
    server: Server = field(default_factory=Server)
    machine: dict[str, Any] = field(default_factory=dict)
    figures: list[Figure] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    async def open(self) -> Bench:
        await wait_for_quiet()
        await self.server.open()
        version, settings = await self.server.describe()
        self.machine = machine_info(version, settings)
        self.machine["server"] = self.server.origin
        print(describe_machine(self.machine))
        return self

    def add(self, figure: Figure) -> None:
        self.figures.append(figure)
        target = (
            f" (target {figure.target}: {'met' if figure.met else 'MISSED'})"
            if figure.met is not None
            else ""
        )
        note = f"  [{figure.note}]" if figure.note else ""
        print(f"  {figure.workload}: {_num(figure.value)} {figure.unit}{target}{note}", flush=True)

    def finish(self, title: str) -> None:
        print_table(title, self.figures)
        if self.figures:
            path = save_results(self.name, self.machine, self.figures, {"details": self.details})
            print(f"\nresults appended to {path.relative_to(ROOT)}")
        self.server.close()


@contextlib.asynccontextmanager
async def profiled(pid: int, name: str, enabled: bool) -> AsyncIterator[Path | None]:
    """With `enabled`, sample `pid` with py-spy (collapsed stacks, 200 Hz) into
    /tmp/bench-profiles/<name>.txt while the block runs. py-spy is not a project dependency:
    `.venv/bin/pip install py-spy`."""
    spy = shutil.which("py-spy", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    if not enabled or spy is None:
        if enabled:
            print("  (py-spy not installed: no profile)")
        yield None
        return
    out = Path("/tmp/bench-profiles") / f"{name}.txt"
    out.parent.mkdir(exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        spy,
        "record",
        "--pid",
        str(pid),
        "--rate",
        "200",
        "--format",
        "raw",
        "--output",
        str(out),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    await asyncio.sleep(0.3)
    try:
        yield out
    finally:
        proc.send_signal(2)  # SIGINT: py-spy writes the file and exits
        await proc.wait()
        print(f"  profile: {out}")
