"""A daemon's connections are bounded by `database_max_connections` whatever the number of queues
(issue 20, defect 2), on a private PostgreSQL with max_connections = 100, as in the report.

Before the budget the engine pool took one connection per queue plus 4: 60 idle queues held 66
connections; 120 queues logged `TooManyConnectionsError` by the hundred while `/readyz` said
200, and a job in q119 was never delivered; a second daemon took the server's last slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from tests.conftest import with_database
from tests.faults.common import (
    PrivatePostgres,
    create_effects_table,
    daemon_env,
    effects_per_key,
    fetchval,
    http_status,
)
from tests.harness import DaemonProcess, wait_until
from tests.harness.fixtures import Spawn
from tests.transports import BROKER, broker_prefix

SERVER_MAX_CONNECTIONS = 100
BUDGET = 20  # the default
_databases = itertools.count()
ENQUEUE = "SELECT dispatcher.enqueue($1, 'record', queue => $2)"


@pytest.fixture(scope="module")
async def small_server() -> AsyncIterator[PrivatePostgres]:
    """A private server with max_connections = 100, shared by this module's tests."""
    pg = PrivatePostgres(Path(tempfile.mkdtemp(prefix="dispatcher-budget-pg-")))
    url = await pg.start()
    conn = await asyncpg.connect(url)
    await conn.execute(f"ALTER SYSTEM SET max_connections = {SERVER_MAX_CONNECTIONS}")
    await conn.close()
    await pg.stop_server()
    await pg.start_server()
    yield pg
    await pg.close()


@pytest.fixture
async def db_url(small_server: PrivatePostgres) -> AsyncIterator[str]:
    """A fresh database on the small server (the daemon migrates it), dropped afterwards."""
    name = f"budget_{next(_databases)}"
    admin = await asyncpg.connect(small_server.url)
    try:
        await admin.execute(f"CREATE DATABASE {name}")
        url = with_database(small_server.url, name)
        await create_effects_table(url)
        yield url
        await admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
    finally:
        await admin.close()


def queues_config(tmp_path: Path, count: int) -> dict[str, str]:
    """A config file with queues q0 .. q<count-1>."""
    path = tmp_path / "queues.toml"
    path.write_text("".join(f"[queues.q{i}]\nmax_inflight = 4\n" for i in range(count)))
    return {"DISPATCHER_CONFIG": str(path)}


@contextlib.asynccontextmanager
async def transport_for(name: str, queues: int) -> AsyncIterator[dict[str, str]]:
    """The daemon environment of a transport; RabbitMQ's queues are deleted afterwards."""
    if name == "in-process":
        yield {}
        return
    async with broker_prefix() as prefix:
        try:
            yield {
                "DISPATCHER_TRANSPORT": "rabbitmq",
                "DISPATCHER_RABBITMQ__URL": BROKER,
                "DISPATCHER_RABBITMQ__QUEUE_PREFIX": prefix,
            }
        finally:
            import aio_pika

            connection = await aio_pika.connect(BROKER)
            async with connection:
                channel = await connection.channel()
                for i in range(queues):
                    await channel.queue_delete(f"{prefix}q{i}")


async def connections_of(db_url: str) -> int:
    """Client connections to the test's database, this question's own excepted."""
    return int(
        await fetchval(
            db_url,
            "SELECT count(*) - 1 FROM pg_stat_activity "
            "WHERE datname = current_database() AND backend_type = 'client backend'",
        )
    )


async def enqueue_one_per_queue(db_url: str, queues: int, prefix: str) -> list[str]:
    keys = [f"{prefix}-q{i}" for i in range(queues)]
    conn = await asyncpg.connect(db_url)
    try:
        for i, key in enumerate(keys):
            await conn.execute(ENQUEUE, key, f"q{i}")
    finally:
        await conn.close()
    return keys


async def delivered(db_url: str, keys: list[str]) -> bool:
    return set(await effects_per_key(db_url)) >= set(keys)


def storm_lines(daemon: DaemonProcess) -> list[str]:
    return [
        line
        for line in daemon.log_text().splitlines()
        if "TooManyConnections" in line or "claim failed" in line
    ]


async def test_an_idle_daemon_with_60_queues_holds_at_most_its_budget(
    spawn: Spawn, db_url: str, tmp_path: Path
) -> None:
    """It held 66 (one per queue + 4 engine, + api, lease, LISTEN)."""
    daemon = await spawn(daemon_env(db_url, **queues_config(tmp_path, 60)))
    keys = await enqueue_one_per_queue(db_url, 60, "idle")
    await wait_until(lambda: delivered(db_url, keys), timeout_s=60, what="a job of each queue")
    most = 0
    for _ in range(20):  # idle now: every claim loop polls every 0.2 s
        most = max(most, await connections_of(db_url))
        await asyncio.sleep(0.1)
    assert 0 < most <= BUDGET, f"an idle daemon with 60 queues held {most} connections"
    assert "database connections at most 20 = api 4 + handlers 4" in daemon.log_text()
    assert storm_lines(daemon) == []


@pytest.mark.parametrize("transport", ["in-process", "rabbitmq"])
async def test_120_queues_deliver_without_a_connection_storm(
    spawn: Spawn, db_url: str, tmp_path: Path, transport: str
) -> None:
    """244 `claim failed … TooManyConnectionsError` lines in 12 s, /readyz 200, q119's job
    never delivered."""
    async with transport_for(transport, 120) as broker_env:
        env = daemon_env(db_url, **queues_config(tmp_path, 120), **broker_env)
        daemon = await spawn(env)
        keys = await enqueue_one_per_queue(db_url, 120, "storm")
        await wait_until(
            lambda: delivered(db_url, keys), timeout_s=90, what="a job of each of 120 queues"
        )
        assert await connections_of(db_url) <= BUDGET
        assert storm_lines(daemon) == []
        assert await http_status(f"{daemon.base_url}/readyz") == 200


@pytest.mark.parametrize("transport", ["in-process", "rabbitmq"])
async def test_two_daemons_with_120_queues_each_fit_a_server_of_100(
    spawn: Spawn, db_url: str, tmp_path: Path, transport: str
) -> None:
    """The issue's acceptance test: every queue delivers, and other clients still connect."""
    async with transport_for(transport, 120) as broker_env:
        env = daemon_env(db_url, **queues_config(tmp_path, 120), **broker_env)
        first = await spawn({**env, "DISPATCHER_INSTANCE_NAME": "first"})
        second = await spawn({**env, "DISPATCHER_INSTANCE_NAME": "second"})
        keys = await enqueue_one_per_queue(db_url, 120, "two")
        most, visits = 0, 0
        while True:  # meanwhile other clients still connect: at least once, however fast
            other = await asyncpg.connect(db_url, timeout=10)
            try:
                most = max(most, await connections_of(db_url) - 1)  # `other` excepted
            finally:
                await other.close()
            visits += 1
            if await delivered(db_url, keys):
                break
            assert visits < 1000, "not every queue delivered"
        assert 0 < most <= 2 * BUDGET
        for daemon in (first, second):
            assert storm_lines(daemon) == []
            assert await http_status(f"{daemon.base_url}/readyz") == 200


async def fill_the_server(url: str, leave_free: int = 0) -> list[asyncpg.Connection]:
    """Connect until the server refuses (superuser slots included), then give back
    `leave_free` of them."""
    held: list[asyncpg.Connection] = []
    while True:
        try:
            held.append(await asyncpg.connect(url, timeout=10))
        except asyncpg.TooManyConnectionsError:
            break
        assert len(held) <= SERVER_MAX_CONNECTIONS
    for conn in held[len(held) - leave_free :] if leave_free else []:
        await conn.close()
    return held[: len(held) - leave_free] if leave_free else held


async def test_a_budget_the_server_cannot_hold_is_refused_at_start(
    spawn: Spawn, db_url: str
) -> None:
    held = await fill_the_server(db_url, leave_free=15)  # 12 free for clients, 3 reserved
    try:
        daemon = await spawn(daemon_env(db_url), wait_ready=False)
        assert await daemon.wait(timeout_s=60) == 1
        refusals = [line for line in daemon.log_text().splitlines() if "does not fit" in line]
        assert len(refusals) == 1, daemon.log_text()[-3000:]
        assert f"database_max_connections = {BUDGET} does not fit on the server" in refusals[0]
        assert f"max_connections {SERVER_MAX_CONNECTIONS} - 3 reserved" in refusals[0]
        assert "lower DISPATCHER_DATABASE_MAX_CONNECTIONS (at least 9)" in refusals[0]
        assert "Traceback" not in daemon.log_text()
        fits = await spawn(daemon_env(db_url, DISPATCHER_DATABASE_MAX_CONNECTIONS="10"))
        assert await http_status(f"{fits.base_url}/readyz") == 200
    finally:
        for conn in held:
            await conn.close()


async def test_a_daemon_starting_on_a_full_server_says_so_in_one_line(
    spawn: Spawn, db_url: str
) -> None:
    """It died with a TooManyConnectionsError traceback from its first connection."""
    held = await fill_the_server(db_url)
    try:
        env = daemon_env(db_url, DISPATCHER_DATABASE_WAIT_S="1")
        daemon = await spawn(env, wait_ready=False)
        assert await daemon.wait(timeout_s=60) == 1
        log = daemon.log_text()
        assert "Traceback" not in log, log[-3000:]
        assert "TooManyConnectionsError" in log and "no free connection slot" in log, log
        lines = [x for x in log.splitlines() if "not reachable after" in x]
        assert len(lines) == 1, log[-3000:]
    finally:
        for conn in held:
            await conn.close()


CUT_CLAIM_CONNECTIONS = """
SELECT pid FROM pg_stat_activity
 WHERE application_name IN ('dispatcher:claims', 'dispatcher:wake-listener')
   AND pg_terminate_backend(pid)"""
STARVED_FOR_S = 2.5  # the wake-up listener retries every second: several refusals


@pytest.mark.parametrize("transport", ["in-process", "rabbitmq"])
async def test_readyz_is_503_while_claim_loops_cannot_connect(
    spawn: Spawn, db_url: str, tmp_path: Path, transport: str
) -> None:
    """The server refuses the claim loops new connections: unready, said once; back to ready
    once it takes them again, before any new job arrives (a RabbitMQ consumer claims only
    what is delivered), and delivering."""
    async with transport_for(transport, 30) as broker_env:
        await readyz_while_starved(spawn, db_url, tmp_path, broker_env)


async def readyz_while_starved(
    spawn: Spawn, db_url: str, tmp_path: Path, broker_env: dict[str, str]
) -> None:
    daemon = await spawn(daemon_env(db_url, **queues_config(tmp_path, 30), **broker_env))
    ready_url = f"{daemon.base_url}/readyz"
    keys = await enqueue_one_per_queue(db_url, 30, "before")
    await wait_until(lambda: delivered(db_url, keys), timeout_s=60, what="jobs before")
    held = await fill_the_server(db_url)
    try:
        # the claim connections go, and the slots they free are taken before the daemon's
        # loops take them back: a terminated backend exits a moment later, so wait for it,
        # fill again, and stop once a full server holds no claim connection
        for _ in range(100):
            cut = [r["pid"] for r in await held[0].fetch(CUT_CLAIM_CONNECTIONS)]
            if not cut:
                break

            async def exited(pids: list[int] = cut, conn: asyncpg.Connection = held[0]) -> bool:
                return not await conn.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)", pids
                )

            await wait_until(exited, timeout_s=10, what="the cut connections gone")
            held += await fill_the_server(db_url)
        else:
            raise AssertionError("the claim connections kept coming back")
        # while the server was filled, the daemon may have won a slot back for a moment (an
        # episode of its own); from here on the server stays full: one episode, said once
        settled = len(daemon.log_text().splitlines())
        during = [f"during-q{i}" for i in range(30)]
        for i, key in enumerate(during):  # work to claim (a broker consumer claims only that)
            await held[0].execute(ENQUEUE, key, f"q{i}")

        async def unready() -> bool:
            return await http_status(ready_url) == 503

        await wait_until(unready, timeout_s=20, what="/readyz 503 while claims are refused")
        body = await readyz_body(ready_url)
        assert "claim loops cannot get a database connection" in body, body
        assert "TooManyConnectionsError" in body, body
        until, seen = time.monotonic() + STARVED_FOR_S, set()
        while time.monotonic() < until:  # unready for as long as it lasts, not flapping
            seen.add(await http_status(ready_url))  # None: no answer within 5 s (a busy host)
        assert 200 not in seen, seen
    finally:
        for conn in held:
            await conn.close()
    await wait_until(
        lambda: http_ok(ready_url), timeout_s=20, what="/readyz 200 once claims can connect"
    )
    await wait_until(lambda: delivered(db_url, during), timeout_s=60, what="jobs during")
    keys = await enqueue_one_per_queue(db_url, 30, "after")
    await wait_until(lambda: delivered(db_url, keys), timeout_s=60, what="jobs after")
    lines = daemon.log_text().splitlines()
    begun = [x for x in lines if "queues are not claimed until it clears" in x]
    ended = [x for x in lines if "have database connections again" in x]
    assert len(begun) == len(ended) >= 1
    assert len([x for x in lines[settled:] if "queues are not claimed until it clears" in x]) <= 1
    assert len([x for x in lines[settled:] if "have database connections again" in x]) == 1
    await wait_until(
        lambda: "wake-up listener connected again" in daemon.log_text(), what="LISTEN again"
    )
    lines = daemon.log_text().splitlines()
    refused = [x for x in lines if "wake-up listener cannot connect" in x]
    assert len(refused) == len([x for x in lines if "wake-up listener connected again" in x])
    assert len([x for x in lines[settled:] if "wake-up listener cannot connect" in x]) <= 1
    assert [x for x in lines if "claim failed" in x and "TooManyConnections" in x] == []


async def readyz_body(url: str) -> str:
    import aiohttp

    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return await r.text()


async def http_ok(url: str) -> bool:
    return await http_status(url) == 200
