"""What the soak runs and breaks: a private embedded PostgreSQL it may restart, and a few
`dispatcher run` processes on it (tests.harness.DaemonProcess), each named `chaos-d<n>` in its
lease owner and in the User-Agent of its HTTP requests, so the target can tell who sent what.

Limits come from the configuration file, written once per limit profile; a daemon that starts
writes its profile's limits to the database, where they are global (DESIGN.md, invariant 4). A
limit change is therefore a daemon restarted with the other profile; every later restart uses
the profile in force.
"""

from __future__ import annotations

import asyncio
import json
import signal
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from dispatcher.db.embedded import EmbeddedPostgres
from tests.chaos.handlers import CREATE_TABLE, SQL_EFFECT
from tests.harness import DaemonProcess, free_port

LEASE_S = 10.0
DRAIN_TIMEOUT_S = 5.0
HTTP_TIMEOUT_S = 3.0
RSS_BOUND_BYTES = 250 * 1024 * 1024  # DESIGN.md invariant 8
SERVER_MAX_CONNECTIONS = 300  # three daemons' pools with room; budgets are issue 20's Build 2


@dataclass(frozen=True)
class Limits:
    """The limited queue's global limits: what the target must never see exceeded."""

    name: str
    rate_per_s: float
    burst: int
    max_inflight: int


PROFILES = (Limits("a", 15.0, 5, 6), Limits("b", 30.0, 10, 12))
LIMITED_QUEUE = "web"  # http jobs; their starts and in-flight are measured at the target
EFFECT_QUEUE = "db"  # python and sql jobs, cron units


def config_text(limits: Limits) -> str:
    """The daemons' configuration file (TOML) for one limit profile."""
    q = LIMITED_QUEUE
    retry = "max_attempts = 6\nbackoff_base_s = 0.2\nbackoff_cap_s = 2.0\n"
    return f"""
lease_s = {LEASE_S}
drain_timeout_s = {DRAIN_TIMEOUT_S}
hard_stop_timeout_s = 3
scan_interval_s = 0.5
db_pool_size = 4
handler_pool_size = 4
target_allow_http = true
target_allow_cidrs = ["127.0.0.0/8"]
log_level = "WARNING"
state_dir_min_free_mb = 0

[http]
default_timeout_s = {HTTP_TIMEOUT_S}

[queues.default]
{retry}
[queues.{q}]
rate_per_s = {limits.rate_per_s}
burst = {limits.burst}
max_inflight = {limits.max_inflight}
{retry}
[queues.{EFFECT_QUEUE}]
rate_per_s = 200
burst = 50
max_inflight = 20
{retry}
[handlers.chaos_py]
kind = "python"
function = "tests.chaos.handlers:record_effect"

[handlers.chaos_sql]
kind = "sql"
statement = {json.dumps(SQL_EFFECT)}
params = ["k", "page_size"]
page_size = 2

[[schedules]]
name = "tick"
cron = "* * * * *"
handler = "chaos_py"
queue = "{EFFECT_QUEUE}"
fanout = {{ ranges = 4, key_space = [0, 4] }}
overlap = "allow"
"""


class Database:
    """The soak's own embedded PostgreSQL in `state_dir` (never the machine's shared server)."""

    def __init__(self, state_dir: Path):
        self._server = EmbeddedPostgres(state_dir, role="daemon", wait_s=60)
        self.dsn = ""

    async def start(self) -> None:
        self.dsn = await asyncio.to_thread(self._server.start)

    async def stop(self) -> None:
        await asyncio.to_thread(self._server.stop)

    async def prepare(self) -> None:
        """Room for three daemons' connections (a restart applies it) and the effects table."""
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute(f"ALTER SYSTEM SET max_connections = {SERVER_MAX_CONNECTIONS}")
            await conn.execute(CREATE_TABLE)
        finally:
            await conn.close()
        await self.stop()
        await self.start()


@dataclass
class Slot:
    """One daemon position: its current process, restarted in place."""

    name: str
    port: int
    process: DaemonProcess | None = None
    frozen: bool = False
    peak_rss_bytes: int = 0
    starts: int = 0


class Daemons:
    def __init__(self, count: int, env: dict[str, str], config_dir: Path, log_dir: Path):
        self.slots = [Slot(f"chaos-d{i}", free_port()) for i in range(count)]
        self.env = env
        self.config_dir = config_dir
        self.log_dir = log_dir
        self.profile = PROFILES[0]
        for limits in PROFILES:
            (config_dir / f"limits-{limits.name}.toml").write_text(config_text(limits))

    def live(self) -> list[Slot]:
        """Slots whose daemon runs and is not frozen: where the load is sent."""
        return [s for s in self.slots if s.process is not None and not s.frozen]

    async def start(self, slot: Slot) -> None:
        env = {
            **self.env,
            "DISPATCHER_CONFIG": str(self.config_dir / f"limits-{self.profile.name}.toml"),
            "DISPATCHER_INSTANCE_NAME": slot.name,
            "DISPATCHER_HTTP__USER_AGENT": slot.name,
            "DISPATCHER_STATE_DIR": str(self.log_dir / slot.name),
        }
        process = DaemonProcess(env, port=slot.port)
        process.log_path.unlink()
        process.log_path = self.log_dir / f"{slot.name}.{slot.starts}.log"
        slot.starts += 1
        await process.start(wait_ready=True)
        slot.process = process

    async def kill(self, slot: Slot) -> None:
        assert slot.process is not None
        slot.process.signal(signal.SIGKILL)
        await slot.process.wait()
        slot.process, slot.frozen = None, False

    def freeze(self, slot: Slot) -> None:
        assert slot.process is not None
        slot.process.signal(signal.SIGSTOP)
        slot.frozen = True

    def thaw(self, slot: Slot) -> None:
        assert slot.process is not None
        slot.process.signal(signal.SIGCONT)
        slot.frozen = False

    async def terminate(self, slot: Slot) -> int:
        """SIGTERM: the graceful drain; its exit status (0 expected; -1: still running 30 s
        later, then killed)."""
        assert slot.process is not None
        process, slot.process = slot.process, None
        try:
            return await process.stop()
        except TimeoutError:
            process.signal(signal.SIGKILL)
            await process.wait()
            return -1

    def sample_rss(self) -> list[tuple[str, int]]:
        """Each live daemon's peak resident size so far (VmHWM, else VmRSS), in bytes."""
        samples = []
        for slot in self.slots:
            if slot.process is None or slot.process.proc is None:
                continue
            peak = _peak_rss_bytes(slot.process.proc.pid)
            slot.peak_rss_bytes = max(slot.peak_rss_bytes, peak)
            samples.append((slot.name, peak))
        return samples

    async def stop_all(self) -> None:
        for slot in self.slots:
            if slot.process is None:
                continue
            if slot.frozen:
                self.thaw(slot)
            if slot.process.proc is not None and slot.process.proc.returncode is None:
                slot.process.signal(signal.SIGKILL)
                await slot.process.wait()
            slot.process = None


def _peak_rss_bytes(pid: int) -> int:
    fields: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = int(value.split()[0]) * 1024
    except (OSError, ValueError):
        return 0
    return fields.get("VmHWM", fields.get("VmRSS", 0))
