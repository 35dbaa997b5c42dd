"""Crash recovery in seconds (invariant 11, issue 20 Build 5; docs/recovery.md).

A daemon killed holding hundreds of running attempts under a 60 s lease has them rescued by
another daemon, or by a successor started after the kill, within seconds (its liveness lock was
released with its session); a daemon frozen by SIGSTOP keeps its lock, so its jobs wait out their
leases, and once it thaws its stale attempts change nothing. Real daemon processes, real
signals, a real loopback target, both transports.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import asyncpg
import pytest
from aiohttp import web

from tests.harness import (
    LOOPBACK_ENV,
    DaemonProcess,
    JobChanges,
    Target,
    job_changes,
    serve_target,
    wait_until,
)
from tests.harness.fixtures import Spawn
from tests.transports import transport, transport_env  # noqa: F401 (fixtures: both transports)

JOBS = 300


@pytest.fixture
def run_env(db_url: str, transport_env: dict[str, str]) -> dict[str, str]:  # noqa: F811
    """The daemons' environment: the test database, loopback delivery, the transport under
    test (`await spawn({**run_env, ...})`)."""
    return {"DISPATCHER_DATABASE_URL": db_url, **LOOPBACK_ENV, **transport_env}


def held_first_attempts() -> tuple[Target, asyncio.Event]:
    """A target whose first request of each key hangs until the event is set; later ones 200."""
    release = asyncio.Event()

    async def respond(request: web.Request, count: int) -> web.StreamResponse:
        if count == 1:
            await release.wait()
        return web.json_response({"ok": True})

    return Target(respond=respond), release


async def post_batch(
    daemon: DaemonProcess, target: Target, prefix: str, n: int, queue: str = "default"
) -> None:
    jobs = [
        {
            "idempotency_key": f"{prefix}-{i}",
            "handler": "http",
            "target": {"url": target.url, "timeout_s": 300},
            "queue": queue,
        }
        for i in range(n)
    ]
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{daemon.base_url}/v1/jobs/batch", json={"jobs": jobs}) as r,
    ):
        assert r.status == 200, await r.text()


async def running_owners(conn: asyncpg.Connection) -> Counter[str]:
    rows = await conn.fetch("SELECT lease_owner FROM dispatcher.job_state WHERE state = 'running'")
    return Counter(r["lease_owner"] for r in rows)


async def owner_of(conn: asyncpg.Connection, daemon: DaemonProcess) -> str:
    assert daemon.proc is not None
    owners = await conn.fetch("SELECT owner FROM dispatcher.instances")
    (owner,) = [r["owner"] for r in owners if f":{daemon.proc.pid}:" in r["owner"]]
    return str(owner)


async def states(conn: asyncpg.Connection) -> dict[str, int]:
    rows = await conn.fetch("SELECT state, count(*) AS n FROM dispatcher.jobs GROUP BY state")
    return {r["state"]: r["n"] for r in rows}


def rescued_from(owner: str) -> Callable[[asyncpg.Connection], Awaitable[bool]]:
    """Whether none of the jobs is running under `owner` any more."""

    async def rescued(conn: asyncpg.Connection) -> bool:
        return owner not in await running_owners(conn)

    return rescued


async def kill_and_time_rescue(jobs: JobChanges, victim: DaemonProcess, owner: str) -> float:
    """SIGKILL `victim`; seconds until none of its jobs is running under its owner id."""
    victim.signal(signal.SIGKILL)
    killed = time.monotonic()
    await victim.wait()
    await jobs.until(rescued_from(owner), timeout_s=40, what="the killed daemon's jobs")
    return time.monotonic() - killed


async def assert_each_job_ended_once(
    conn: asyncpg.Connection, jobs: JobChanges, target: Target, owner: str
) -> None:
    await jobs.until_states({"succeeded": JOBS}, timeout_s=60)
    rows = await conn.fetch("""
        SELECT a.job_id, a.outcome, a.reason, a.owner FROM dispatcher.attempt_history a
         ORDER BY a.job_id, a.id""")
    by_job: dict[int, list[tuple[str, str | None, bool]]] = {}
    for r in rows:
        by_job.setdefault(r["job_id"], []).append((r["outcome"], r["reason"], r["owner"] == owner))
    assert len(by_job) == JOBS
    # the killed daemon's attempt ended by the rescue (owner_gone), then one success elsewhere
    assert set(map(tuple, by_job.values())) == {
        (("lease_expired", "owner_gone", True), ("succeeded", None, False))
    }
    assert Counter(Counter(target.request_keys()).values()) == {2: JOBS}


LONG_LEASE = {
    "DISPATCHER_LEASE_S": "60",
    "DISPATCHER_QUEUES__DEFAULT__MAX_INFLIGHT": str(JOBS),
    "DISPATCHER_HTTP__MAX_CONNECTIONS": str(JOBS),
}


async def test_a_killed_daemons_running_jobs_are_rescued_by_another_within_seconds(
    db_url: str, spawn: Spawn, run_env: dict[str, str]
) -> None:
    target, release = held_first_attempts()
    conn = await asyncpg.connect(db_url)
    try:
        async with serve_target(target), job_changes(db_url) as jobs:
            victim = await spawn({**run_env, **LONG_LEASE})
            owner = await owner_of(conn, victim)
            await post_batch(victim, target, "held", JOBS)
            await target.wait_for(lambda t: t.inflight == JOBS, what=f"{JOBS} attempts in flight")
            assert await running_owners(conn) == {owner: JOBS}
            survivor = await spawn({**run_env, **LONG_LEASE})
            took_s = await kill_and_time_rescue(jobs, victim, owner)
            print(f"\n{JOBS} running jobs of a SIGKILLed daemon rescued in {took_s:.2f} s")
            assert took_s < 15, f"rescued after {took_s:.1f} s: the 60 s lease, not the lock"
            await assert_each_job_ended_once(conn, jobs, target, owner)
            assert "jobs of gone daemons" in survivor.log_text()
            assert await survivor.stop() == 0
            release.set()
    finally:
        await conn.close()


async def test_a_successor_started_after_the_kill_rescues_within_seconds(
    db_url: str, spawn: Spawn, run_env: dict[str, str]
) -> None:
    target, release = held_first_attempts()
    conn = await asyncpg.connect(db_url)
    try:
        async with serve_target(target), job_changes(db_url) as jobs:
            victim = await spawn({**run_env, **LONG_LEASE})
            owner = await owner_of(conn, victim)
            await post_batch(victim, target, "held", JOBS)
            await target.wait_for(lambda t: t.inflight == JOBS, what=f"{JOBS} attempts in flight")
            victim.signal(signal.SIGKILL)
            await victim.wait()
            started = time.monotonic()
            successor = await spawn({**run_env, **LONG_LEASE})
            ready_s = time.monotonic() - started
            await jobs.until(rescued_from(owner), timeout_s=40, what="the rescue")
            took_s = time.monotonic() - started
            print(
                f"\nsuccessor ready in {ready_s:.2f} s; {JOBS} jobs rescued {took_s:.2f} s after"
                " its start"
            )
            assert took_s - ready_s < 10, f"rescued {took_s:.1f} s after the successor started"
            await assert_each_job_ended_once(conn, jobs, target, owner)
            assert await successor.stop() == 0
            release.set()
    finally:
        await conn.close()


async def test_a_frozen_daemon_is_not_rescued_before_its_lease_expires(
    db_url: str, spawn: Spawn, run_env: dict[str, str]
) -> None:
    n, lease_s = 40, 4.0
    target, release = held_first_attempts()
    env = {"DISPATCHER_LEASE_S": str(lease_s), "DISPATCHER_DRAIN_TIMEOUT_S": "2"}
    conn = await asyncpg.connect(db_url)
    try:
        async with serve_target(target), job_changes(db_url) as jobs:
            frozen = await spawn({**run_env, **env})
            owner = await owner_of(conn, frozen)
            await post_batch(frozen, target, "frozen", n)
            await target.wait_for(lambda t: t.inflight == n, what=f"{n} attempts in flight")
            other = await spawn({**run_env, **env})
            frozen.signal(signal.SIGSTOP)
            # its last heartbeat before the stop set the earliest expiry we may see
            first_expiry = await conn.fetchval(
                "SELECT min(lease_expires_at) FROM dispatcher.job_state WHERE state = 'running'"
            )
            looks = 0
            while await conn.fetchval("SELECT now() < $1", first_expiry):
                assert await running_owners(conn) == {owner: n}, "rescued before lease expiry"
                looks += 1
                await asyncio.sleep(0.1)
            assert looks >= 10  # the window was watched for a second or more
            # then the lease rule rescues them (the liveness rule never did: no owner_gone)
            await jobs.until(
                lambda c: _lease_rescued(c, owner, n), timeout_s=30, what="the lease rescue"
            )
            # (RabbitMQ: deliveries the frozen daemon prefetched wait in it until it thaws)
            frozen.signal(signal.SIGCONT)
            release.set()  # the thawed daemon's held first requests now answer 200
            await jobs.until_states({"succeeded": n}, timeout_s=60)
            assert await frozen.stop() == 0
            assert await other.stop() == 0
            # its stale attempts changed nothing: attempt 1 ended by the lease, 2 succeeded
            history = await conn.fetch("""
                SELECT a.attempt, a.outcome, a.reason FROM dispatcher.attempt_history a
                 ORDER BY a.job_id, a.id""")
            assert [tuple(r) for r in history] == [
                (1, "lease_expired", None),
                (2, "succeeded", None),
            ] * n
            assert (
                await conn.fetchval("SELECT count(*) FROM dispatcher.jobs WHERE attempt = 2") == n
            )
            assert Counter(Counter(target.request_keys()).values()) == {2: n}
    finally:
        await conn.close()


async def _lease_rescued(conn: asyncpg.Connection, owner: str, n: int) -> bool:
    rescued = await conn.fetchval(
        "SELECT count(*) FROM dispatcher.attempt_history WHERE outcome = 'lease_expired'"
        " AND reason IS NULL AND owner = $1",
        owner,
    )
    return bool(rescued == n)


async def _states_are(conn: asyncpg.Connection, expected: dict[str, int]) -> bool:
    return await states(conn) == expected


async def test_a_postgres_restart_takes_no_living_daemons_jobs(
    tmp_path: Path, spawn: Spawn
) -> None:
    """Every session lock vanishes with the server: the daemons take theirs back and none is
    judged gone (the restart grace), so nobody's running jobs move."""
    from tests.faults.common import PrivatePostgres

    n = 20
    target, release = held_first_attempts()
    pg = PrivatePostgres(tmp_path / "pg")
    daemons: list[DaemonProcess] = []
    try:
        url = await pg.start()
        async with serve_target(target):
            env = {"DISPATCHER_DATABASE_URL": url, **LOOPBACK_ENV, **LONG_LEASE}
            for name in ("left", "right"):  # a queue each, so each holds its own jobs
                own_queue = {f"DISPATCHER_QUEUES__{name.upper()}__MAX_INFLIGHT": str(n)}
                daemon = await spawn({**env, **own_queue})
                daemons.append(daemon)
                await post_batch(daemon, target, name, n, queue=name)
                await target.wait_for(lambda t: t.inflight == len(daemons) * n)
            conn = await asyncpg.connect(url)
            before = await running_owners(conn)
            await conn.close()
            assert sorted(before.values()) == [n, n]

            await pg.stop_server()
            await pg.start_server()
            conn = await asyncpg.connect(url)
            try:
                # past the grace (5 s of uptime) and the confirmation (1 s), with margin
                until = time.monotonic() + 8
                while time.monotonic() < until:
                    assert await running_owners(conn) == before
                    await asyncio.sleep(0.2)
                gone = await conn.fetchval(
                    "SELECT count(*) FROM dispatcher.attempt_history WHERE reason = 'owner_gone'"
                )
                assert gone == 0
                for daemon in daemons:
                    assert "liveness lock taken again" in daemon.log_text()
                release.set()
                await wait_until(lambda: _states_are(conn, {"succeeded": 2 * n}), timeout_s=60)
                assert await conn.fetchval("SELECT max(attempt) FROM dispatcher.jobs") == 1
            finally:
                await conn.close()
            for daemon in daemons:
                assert await daemon.stop() == 0
    finally:
        release.set()
        for daemon in daemons:
            if daemon.proc is not None and daemon.proc.returncode is None:
                daemon.proc.kill()
                await daemon.proc.wait()
        await pg.close()


async def test_a_daemon_whose_lock_connection_is_cut_takes_it_back_and_keeps_its_jobs(
    db_url: str, spawn: Spawn
) -> None:
    """The server ends a living daemon's liveness session (pg_terminate_backend): it takes the
    lock again on a new connection at once, and the other daemon judges nobody gone."""
    n = 20
    target, release = held_first_attempts()
    env = {"DISPATCHER_DATABASE_URL": db_url, **LOOPBACK_ENV, **LONG_LEASE}
    daemons: list[DaemonProcess] = []
    conn = await asyncpg.connect(db_url)
    try:
        async with serve_target(target), job_changes(db_url) as jobs:
            cut = await spawn(env)
            daemons.append(cut)
            owner = await owner_of(conn, cut)
            await post_batch(cut, target, "cut", n)
            await target.wait_for(lambda t: t.inflight == n, what=f"{n} attempts in flight")
            daemons.append(await spawn(env))
            ended = await conn.fetchval(
                """SELECT count(pg_terminate_backend(l.pid)) FROM pg_locks l
                    WHERE l.locktype = 'advisory' AND l.objsubid = 2
                      AND l.classid = dispatcher.liveness_namespace()::oid
                      AND l.objid = dispatcher.liveness_key($1)::oid""",
                owner,
            )
            assert ended == 1
            await cut.log.wait_for("liveness lock taken again")
            until = time.monotonic() + 3  # past the others' 1 s confirmation, with margin
            while time.monotonic() < until:
                assert await running_owners(conn) == {owner: n}
                await asyncio.sleep(0.1)
            assert await cut.is_ready()
            assert not await conn.fetchval(
                "SELECT count(*) FROM dispatcher.attempt_history WHERE reason = 'owner_gone'"
            )
            release.set()
            await jobs.until_states({"succeeded": n}, timeout_s=60)
            for daemon in daemons:
                assert await daemon.stop() == 0
    finally:
        release.set()
        await conn.close()
        for daemon in daemons:
            if daemon.proc is not None and daemon.proc.returncode is None:
                daemon.proc.kill()
                await daemon.proc.wait()
