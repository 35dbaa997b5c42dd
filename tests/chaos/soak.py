"""The chaos soak, start to end: set up (a private embedded PostgreSQL, the target, a broker
proxy, three daemons), chaos for the given minutes (load + faults + continuous checks), settle
(faults undone, every accepted job must reach a terminal state), final checks, report.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from tests.chaos import checks
from tests.chaos.cluster import LEASE_S, RSS_BOUND_BYTES, Daemons, Database
from tests.chaos.faults import Injector
from tests.chaos.load import CLIENT_TIMEOUT_S, Api, Load
from tests.chaos.targets import ChaosTarget, serve
from tests.harness import LOOPBACK_ENV
from tests.outage_proxy import OutageProxy
from tests.transports import BROKER, broker_up

DAEMONS = 3
JOBS_PER_S = 12.0
TRIGGER_EVERY_S = 4.0
READ_EVERY_S = 2.0
UNITS_PER_RUN = 4  # the `tick` schedule's fan-out
# A queue with runnable work makes progress within this: a frozen daemon's jobs hold their
# in-flight slots until the lease expires and a peer rescues them, then the queue moves again.
STALL_BOUND_S = LEASE_S + 20.0
SETTLE_S = 120.0  # after the chaos, every accepted job is terminal within this
SAMPLE_EVERY_S = 1.0
TERMINAL_SQL = "('succeeded', 'dead', 'cancelled', 'discarded')"
RUNNABLE = "(j.state = 'ready' OR (j.state = 'scheduled' AND j.due_at < now() - interval '2 s'))"
# Per queue: its oldest runnable job and how many there are. Claims take the earliest due first
# (DESIGN.md, scheduling policy), so a queue that makes progress moves its oldest job on soon; the
# same oldest job for longer than the bound is a stall, whatever else the queue does (a queue
# that only re-runs a few doomed jobs is stalled for the rest).
QUEUE_PROGRESS = f"""
SELECT q.name, q.paused, o.id AS oldest, c.n AS runnable
  FROM dispatcher.queues q
  LEFT JOIN LATERAL (SELECT j.id FROM dispatcher.jobs j WHERE j.queue = q.name AND {RUNNABLE}
                      ORDER BY j.due_at, j.id LIMIT 1) o ON true
  LEFT JOIN LATERAL (SELECT count(*) AS n FROM dispatcher.jobs j
                      WHERE j.queue = q.name AND {RUNNABLE}) c ON true"""


@dataclass
class Monitor:
    """Continuous checks, once a second: queue progress (stalls) and each daemon's RSS."""

    pool: asyncpg.Pool
    daemons: Daemons
    worst_stall_s: dict[str, float] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    unreachable_samples: int = 0
    _since: dict[str, float] = field(default_factory=dict)
    _oldest: dict[str, int | None] = field(default_factory=dict)
    _reported: set[str] = field(default_factory=set)
    _database_away: bool = False

    async def run(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_EVERY_S)
            self._rss()
            try:
                rows = await self.pool.fetch(QUEUE_PROGRESS, timeout=5)
            except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
                self.unreachable_samples += 1
                self._database_away = True
                continue
            self._stalls(rows, time.monotonic())

    def _stalls(self, rows: list[asyncpg.Record], now: float) -> None:
        away, self._database_away = self._database_away, False
        for row in rows:
            name = row["name"]
            moved = self._oldest.get(name) != row["oldest"]
            self._oldest[name] = row["oldest"]
            if away or moved or row["paused"] or not row["runnable"] or name not in self._since:
                self._since[name] = now  # the clock runs only while work waits and nothing moves
            stall = now - self._since[name]
            self.worst_stall_s[name] = max(self.worst_stall_s.get(name, 0.0), stall)
            if stall > STALL_BOUND_S and name not in self._reported:
                self._reported.add(name)
                self.violations.append(
                    f"queue {name}: {row['runnable']} runnable jobs, the oldest (id "
                    f"{row['oldest']}) not started for {stall:.0f} s (bound {STALL_BOUND_S:g} s)"
                )

    def _rss(self) -> None:
        for name, peak in self.daemons.sample_rss():
            if peak > RSS_BOUND_BYTES and f"rss {name}" not in self._reported:
                self._reported.add(f"rss {name}")
                self.violations.append(
                    f"{name}: peak RSS {peak / 2**20:.0f} MB over {RSS_BOUND_BYTES / 2**20:.0f} MB"
                )


@dataclass
class Options:
    minutes: float
    transport: str  # inprocess | rabbitmq
    seed: int
    keep_dir: bool = False


async def run_soak(options: Options) -> dict[str, Any]:
    """Run the soak; the report (its `violations` empty when every check held)."""
    started = time.monotonic()
    base = Path(tempfile.mkdtemp(prefix="dispatcher-chaos-"))
    report: dict[str, Any] = {}
    try:
        report = await _soak(options, base)
    finally:
        report["wall_s"] = round(time.monotonic() - started, 1)
        if report.get("violations") or options.keep_dir:
            report["kept_dir"] = str(base)  # the daemons' logs, for whoever reads the report
        else:
            shutil.rmtree(base, ignore_errors=True)
    return report


async def _soak(options: Options, base: Path) -> dict[str, Any]:
    database = Database(base / "db")
    await database.start()
    await database.prepare()
    prefix = f"chaos{uuid.uuid4().hex[:8]}."
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(database.stop)
        broker = await _broker(options, stack, prefix)
        target = await stack.enter_async_context(serve(ChaosTarget()))
        env = {**LOOPBACK_ENV, "DISPATCHER_DATABASE_URL": database.dsn}
        if broker is not None:
            env |= {
                "DISPATCHER_TRANSPORT": "rabbitmq",
                "DISPATCHER_RABBITMQ__URL": broker.url,
                "DISPATCHER_RABBITMQ__QUEUE_PREFIX": prefix,
                "DISPATCHER_RABBITMQ__RECONNECT_MAX_S": "2",
                # the relay's lease on outbox rows, like a job's: what a killed, frozen or
                # failed relay round holds is waited out within the same stall bound
                "DISPATCHER_RABBITMQ__RELAY_LEASE_S": str(LEASE_S),
            }
        (base / "logs").mkdir()
        daemons = Daemons(DAEMONS, env, base, base / "logs")
        stack.push_async_callback(daemons.stop_all)
        await daemons.start(daemons.slots[0])  # the first one migrates the schema
        await asyncio.gather(*(daemons.start(s) for s in daemons.slots[1:]))
        # min_size 0: no pool floor to restore (and log) while the database restarts
        pool = await asyncpg.create_pool(database.dsn, min_size=0, max_size=4)
        stack.push_async_callback(pool.close)
        timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
        session = await stack.enter_async_context(aiohttp.ClientSession(timeout=timeout))
        # one generator each: the fault schedule does not shift with how the load's timing went
        api = Api(daemons, session, random.Random(f"api-{options.seed}"))
        load = Load(api, pool, target, random.Random(f"load-{options.seed}"))
        faults_rng = random.Random(f"faults-{options.seed}")
        injector = Injector(daemons, database, api, faults_rng, broker)
        monitor = Monitor(pool, daemons)
        return await _chaos_then_settle(options, daemons, load, injector, monitor, pool, target)
    raise AssertionError("unreachable")


async def _broker(
    options: Options, stack: contextlib.AsyncExitStack, prefix: str
) -> OutageProxy | None:
    if options.transport != "rabbitmq":
        return None
    if not broker_up():
        raise SystemExit("the rabbitmq soak needs RabbitMQ on 127.0.0.1:5672 (guest/guest)")
    proxy = OutageProxy(BROKER)
    await proxy.restore()
    stack.push_async_callback(_delete_queues, prefix)
    stack.push_async_callback(proxy.cut)
    return proxy


async def _delete_queues(prefix: str) -> None:
    import aio_pika

    connection = await aio_pika.connect(BROKER)
    async with connection:
        channel = await connection.channel()
        for queue in ("default", "web", "db"):
            with contextlib.suppress(Exception):
                await channel.queue_delete(prefix + queue)


async def _chaos_then_settle(
    options: Options,
    daemons: Daemons,
    load: Load,
    injector: Injector,
    monitor: Monitor,
    pool: asyncpg.Pool,
    target: ChaosTarget,
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    until = loop.time() + options.minutes * 60
    print(f"chaos: {options.minutes:g} min on {options.transport}, seed {options.seed}", flush=True)
    watcher = asyncio.create_task(monitor.run())
    progress = asyncio.create_task(_progress(load, injector, monitor))
    try:
        await asyncio.gather(
            load.stream(JOBS_PER_S, until),
            load.triggers_loop(TRIGGER_EVERY_S, until),
            load.reads_loop(READ_EVERY_S, until),
            injector.run(until),
        )
        await injector.heal()
        await load.drain()
        settle_s = await _settle(pool, load)
    finally:
        progress.cancel()
        watcher.cancel()
    for slot in daemons.slots:
        if slot.process is not None:
            injector.drain_exits.append((slot.name, await daemons.terminate(slot)))
    timing = (started, settle_s)
    return await _final_report(options, load, injector, monitor, pool, target, daemons, timing)


async def _settle(pool: asyncpg.Pool, load: Load) -> float:
    """Wait until no job is open (every accepted one terminal), up to SETTLE_S."""
    started = time.monotonic()
    while time.monotonic() - started < SETTLE_S:
        with contextlib.suppress(OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            open_jobs = await pool.fetchval(
                f"SELECT count(*) FROM dispatcher.jobs WHERE state NOT IN {TERMINAL_SQL}"
            )
            known = await pool.fetchval(
                "SELECT count(*) FROM dispatcher.jobs WHERE key = ANY($1)", list(load.accepted)
            )
            if open_jobs == 0 and known == len(load.accepted):
                break
        await asyncio.sleep(1)
    return round(time.monotonic() - started, 1)


async def _progress(load: Load, injector: Injector, monitor: Monitor) -> None:
    while True:
        await asyncio.sleep(15)
        faults = Counter(f.kind for f in injector.faults)
        print(
            f"chaos: {len(load.accepted)} accepted, faults {dict(faults)}, worst stall "
            f"{max(monitor.worst_stall_s.values(), default=0):.1f} s, violations so far "
            f"{len(monitor.violations) + len(load.api.server_errors)}",
            flush=True,
        )


async def _final_report(
    options: Options,
    load: Load,
    injector: Injector,
    monitor: Monitor,
    pool: asyncpg.Pool,
    target: ChaosTarget,
    daemons: Daemons,
    timing: tuple[float, float],
) -> dict[str, Any]:
    started, settle_s = timing  # when the chaos began (monotonic), how long the settle took
    rows = {
        r["key"]: checks.JobRow(**dict(r))
        for r in await pool.fetch(
            "SELECT key, state, handler, queue, run_key, dead_reason, attempt FROM dispatcher.jobs"
        )
    }
    runs = {r["key"]: r["runs"] for r in await pool.fetch("SELECT key, runs FROM chaos_effects")}
    findings = {
        "nothing_lost": checks.nothing_lost(load.accepted, rows),
        "effects_once": checks.effects_once(rows, runs),
        "cron_units": checks.cron_units(rows, UNITS_PER_RUN),
        "outcomes": checks.outcomes_expected(rows, load.behaviours),
        "http_repeats": checks.http_repeats(target.hits, injector.faults),
        "limits": checks.limits_held(target.hits, injector.faults, injector.close_spans()),
    }
    violations = [f"{name}: {v}" for name, f in findings.items() for v in f.violations]
    violations += [f"stall/rss: {v}" for v in monitor.violations]
    violations += [f"api 5xx: {v}" for v in load.api.server_errors[:20]]
    violations += [f"api refused a valid job: {v}" for v in load.refused[:20]]
    violations += [f"fault not undone: {v}" for v in injector.failures]
    violations += [f"drain: {n} exited {c} after SIGTERM" for n, c in injector.drain_exits if c]
    by_door: Counter[str] = Counter()
    for key, door in load.accepted.items():
        by_door[f"{door}/{rows[key].state if key in rows else 'missing'}"] += 1
    by_behaviour: Counter[str] = Counter()
    for key, behaviour in load.behaviours.items():
        if key in rows:
            row = rows[key]
            reason = f" ({row.dead_reason})" if row.dead_reason else ""
            by_behaviour[f"{behaviour}/{row.state}{reason}"] += 1
    cron_states = Counter(r.state for r in rows.values() if r.run_key)
    return {
        "transport": options.transport,
        "seed": options.seed,
        "minutes": options.minutes,
        "settle_s": settle_s,
        "jobs_by_door_kind_outcome": dict(sorted(by_door.items())),
        "jobs_by_behaviour_outcome": dict(sorted(by_behaviour.items())),
        "cron_units_by_outcome": dict(cron_states),
        "cron_triggers_by_status": dict(load.triggers),
        "submissions_given_up": len(load.given_up),
        "faults": dict(Counter(f.kind for f in injector.faults)),
        "fault_log": [
            [round(f.start - started, 1), f.kind, f.subject, round(f.end - f.start, 1), f.detail]
            for f in injector.faults
        ],
        "worst_stall_s": {q: round(s, 1) for q, s in sorted(monitor.worst_stall_s.items())},
        "stall_bound_s": STALL_BOUND_S,
        "peak_rss_mb": {s.name: round(s.peak_rss_bytes / 2**20, 1) for s in daemons.slots},
        "rss_bound_mb": RSS_BOUND_BYTES / 2**20,
        "api_statuses": {str(k): v for k, v in sorted(load.api.statuses.items())},
        "sql_door_errors": dict(load.sql_errors),
        "database_unreachable_samples": monitor.unreachable_samples,
        "checks": {name: _plain(f.figures) for name, f in findings.items()},
        "violations": violations,
    }


def _plain(figures: dict[str, object]) -> dict[str, object]:
    return {k: dict(v) if isinstance(v, Counter) else v for k, v in figures.items()}
