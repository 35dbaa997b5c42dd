"""The queue wake gates across real daemons (db/functions/10_wake.sql, engine/wake_gates.py): a
claim loop that waits for work holds its queue's gate, so a job enqueued through the SQL door
notifies ('ready:<queue>') and starts at once; a busy loop (its one slot taken) lets it go, so
intake into its queue sends no notice and the jobs start when the slot frees; with two daemons
the idle one is woken while the other is busy; a SIGKILLed daemon's gate goes with its session;
with `wakeups = "poll"` no gate is held and intake sends nothing.

The work poll runs once an hour here (`scan_interval_s`), so a job that starts within the
test's deadline was started by a notice or by a loop's own claim, never by the poll.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator

import asyncpg
import pytest
from aiohttp import web

from tests.harness import LOOPBACK_ENV, Target, serve_target, wait_until
from tests.harness.fixtures import Spawn

START_BOUND_S = 1.0  # as tests/e2e/test_wake_gate.py: later means the notice was lost
BUSY_JOBS = 5
SLOT_OF_ONE = {
    "DISPATCHER_SCAN_INTERVAL_S": "3600",
    "DISPATCHER_QUEUES__DEFAULT__MAX_INFLIGHT": "1",
    **LOOPBACK_ENV,
}


class Blocking(Target):
    """Answers every request at once, except those whose key starts with 'block', which wait
    for `release`."""

    def __init__(self) -> None:
        super().__init__(respond=self._answer)
        self.release = asyncio.Event()

    async def _answer(self, request: web.Request, _count: int) -> web.StreamResponse:
        if (request.headers.get("Idempotency-Key") or "").startswith("block"):
            await self.release.wait()
        return web.json_response({"ok": True})


@pytest.fixture
async def target() -> AsyncIterator[Blocking]:
    async with serve_target(Blocking()) as t:
        yield t  # type: ignore[misc]


@pytest.fixture
async def conn(db_url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(db_url)
    try:
        yield connection
    finally:
        await connection.close()


async def enqueue(conn: asyncpg.Connection, key: str, target: Target) -> None:
    await conn.execute(
        "SELECT dispatcher.enqueue($1, 'http', target => $2::jsonb)",
        key,
        json.dumps({"url": target.url}),
    )


async def notices_of(conn: asyncpg.Connection, keys: list[str], target: Target) -> list[str]:
    """Enqueue `keys` one per statement and return the notices they sent: a sentinel NOTIFY
    follows them, and notices arrive in commit order."""
    heard: list[str] = []

    def hear(*args: object) -> None:
        heard.append(str(args[-1]))

    await conn.add_listener("dispatcher_wake", hear)
    try:
        for key in keys:
            await enqueue(conn, key, target)
        await conn.execute("NOTIFY dispatcher_wake, 'sentinel'")
        await wait_until(lambda: "sentinel" in heard, what="the sentinel notice")
    finally:
        await conn.remove_listener("dispatcher_wake", hear)
    return heard[: heard.index("sentinel")]


async def start_delay_s(conn: asyncpg.Connection, key: str) -> float:
    delay: float = await conn.fetchval(
        "SELECT extract(epoch FROM started_at - created_at)::float8 FROM dispatcher.jobs"
        " WHERE key = $1",
        key,
    )
    return delay


def gate_held(conn: asyncpg.Connection, held: bool = True) -> object:
    async def check() -> bool:
        return bool(await conn.fetchval("SELECT dispatcher.wake_gate_held('default')")) is held

    return check


async def test_an_idle_daemon_is_woken_at_once_and_a_busy_one_gets_no_notice(
    db_url: str, target: Blocking, conn: asyncpg.Connection, spawn: Spawn
) -> None:
    await spawn({"DISPATCHER_DATABASE_URL": db_url, **SLOT_OF_ONE})
    await wait_until(gate_held(conn), what="the idle claim loop holding its gate")  # type: ignore[arg-type]
    assert await notices_of(conn, ["idle"], target) == ["ready:default"]
    await target.wait_for(lambda t: "idle" in t.request_keys(), what="its start")
    assert await start_delay_s(conn, "idle") < START_BOUND_S

    await enqueue(conn, "block", target)  # takes the queue's one slot
    await target.wait_for(lambda t: "block" in t.request_keys(), what="the blocking job")
    await wait_until(gate_held(conn, False), what="the busy loop letting its gate go")  # type: ignore[arg-type]
    keys = [f"busy-{n}" for n in range(BUSY_JOBS)]
    assert await notices_of(conn, keys, target) == [], "intake notified a busy daemon"

    target.release.set()  # the slot frees: the loop claims them, no notice needed
    await target.wait_for(
        lambda t: set(keys) <= set(t.request_keys()), what="the jobs enqueued while busy"
    )
    await wait_until(gate_held(conn), what="the loop waiting again, holding its gate")  # type: ignore[arg-type]


async def test_with_two_daemons_the_waiting_one_is_woken_while_the_other_is_busy(
    db_url: str, target: Blocking, conn: asyncpg.Connection, spawn: Spawn
) -> None:
    """The first daemon's one slot is taken (it lets its gate go); the second, started with two
    slots (the queue's cap across daemons is the last one configured: two), waits for work and
    holds the gate: a job enqueued now notifies and is started at once. The first daemon takes
    the new cap within a second and may be waiting too by then (two holders): either may start
    it, and the count asked for is "at least one", not "exactly one" (a loaded CI machine ran
    past the instant with exactly one)."""
    env = {"DISPATCHER_DATABASE_URL": db_url, **SLOT_OF_ONE}

    async def holders(n: int, *, at_least: bool = False) -> bool:
        held: int = await conn.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND classid = 1684632433 AND objid = hashtext('default')::oid"
        )
        return held >= n if at_least else held == n

    await spawn(env)
    await wait_until(lambda: holders(1), what="the first daemon's idle loop holding the gate")
    await enqueue(conn, "block", target)
    await target.wait_for(lambda t: "block" in t.request_keys(), what="the blocking job")
    await wait_until(lambda: holders(0), what="the busy daemon letting its gate go")
    await spawn({**env, "DISPATCHER_QUEUES__DEFAULT__MAX_INFLIGHT": "2"})
    await wait_until(lambda: holders(1, at_least=True), what="an idle loop holding the gate")
    assert await notices_of(conn, ["quick"], target) == ["ready:default"]
    await target.wait_for(lambda t: "quick" in t.request_keys(), what="its start")
    assert await start_delay_s(conn, "quick") < START_BOUND_S
    target.release.set()
    await wait_until(lambda: holders(2), what="both loops waiting again, holding the gate")


async def test_a_killed_daemons_queue_gate_goes_with_its_session(
    db_url: str, target: Blocking, conn: asyncpg.Connection, spawn: Spawn
) -> None:
    daemon = await spawn({"DISPATCHER_DATABASE_URL": db_url, **SLOT_OF_ONE})
    await wait_until(gate_held(conn), what="the idle claim loop holding its gate")  # type: ignore[arg-type]
    daemon.signal(signal.SIGKILL)
    await daemon.wait()
    await wait_until(gate_held(conn, False), what="the killed daemon's session to end")  # type: ignore[arg-type]
    assert await notices_of(conn, ["after-kill"], target) == []
    await spawn({"DISPATCHER_DATABASE_URL": db_url, **SLOT_OF_ONE})  # finds it at start
    await target.wait_for(lambda t: "after-kill" in t.request_keys(), what="its start")


async def test_in_poll_mode_no_gate_is_held_and_intake_sends_nothing(
    db_url: str, target: Blocking, conn: asyncpg.Connection, spawn: Spawn
) -> None:
    await spawn(
        {
            "DISPATCHER_DATABASE_URL": db_url,
            **SLOT_OF_ONE,
            "DISPATCHER_DATABASE__WAKEUPS": "poll",
            "DISPATCHER_DATABASE__POLL_INTERVAL_S": "0.1",
        }
    )
    assert await notices_of(conn, ["polled"], target) == []
    await target.wait_for(lambda t: "polled" in t.request_keys(), what="its start by the poll")
    assert not await conn.fetchval("SELECT dispatcher.wake_gate_held()")
    assert not await conn.fetchval("SELECT dispatcher.wake_gate_held('default')")
