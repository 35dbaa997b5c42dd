"""The wake gate across real daemons (db/functions/10_wake.sql): every listening daemon holds
it, so when one is killed (SIGKILL) the other still holds it and a job enqueued through the SQL
door right after starts by its notice alone; with no daemon left no notice is sent, and the
next daemon to start finds the job itself.

The work poll runs once an hour here (`scan_interval_s`), so a job that starts within the
test's deadline was started by a notice or by a daemon's look at start, never by the poll.
"""

from __future__ import annotations

import json
import signal
from collections.abc import AsyncIterator

import asyncpg
import pytest

from tests.harness import LOOPBACK_ENV, Target, serve_target, wait_until
from tests.harness.fixtures import Spawn

HOLDERS = """
    SELECT count(*) FROM pg_locks
     WHERE locktype = 'advisory' AND granted AND classid = 1684632439 AND objid = 0
       AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"""
# W3 (tests/bench/peers) puts p99 at tens of milliseconds on a loaded 2-core machine; a start
# this late would mean the notice was lost and something else found the job
START_BOUND_S = 1.0


@pytest.fixture
async def target() -> AsyncIterator[Target]:
    async with serve_target(Target()) as t:
        yield t


async def enqueue_now(conn: asyncpg.Connection, key: str, target: Target) -> None:
    await conn.execute(
        "SELECT dispatcher.enqueue($1, 'http', target => $2::jsonb)",
        key,
        json.dumps({"url": target.url}),
    )


async def start_delay_s(conn: asyncpg.Connection, key: str) -> float:
    delay: float = await conn.fetchval(
        "SELECT extract(epoch FROM started_at - created_at)::float8 FROM dispatcher.jobs"
        " WHERE key = $1",
        key,
    )
    return delay


async def test_a_killed_daemon_leaves_the_gate_with_the_other_and_no_notice_is_lost(
    db_url: str, target: Target, spawn: Spawn
) -> None:
    env = {"DISPATCHER_DATABASE_URL": db_url, **LOOPBACK_ENV, "DISPATCHER_SCAN_INTERVAL_S": "3600"}
    first, second = await spawn(env), await spawn(env)
    conn = await asyncpg.connect(db_url)
    try:

        async def holders(n: int) -> bool:
            held: int = await conn.fetchval(HOLDERS)
            return held == n

        await wait_until(lambda: holders(2), what="both daemons holding the gate")
        first.signal(signal.SIGKILL)
        await first.wait()
        await wait_until(lambda: holders(1), what="the killed daemon's session to end")

        await enqueue_now(conn, "after-kill", target)
        await target.wait_for(lambda t: "after-kill" in t.request_keys(), what="its start")
        delay = await start_delay_s(conn, "after-kill")
        assert delay < START_BOUND_S, f"started {delay:.3f} s after its enqueue"

        second.signal(signal.SIGKILL)
        await second.wait()
        await wait_until(lambda: holders(0), what="no daemon holding the gate")
        heard: list[str] = []
        await conn.add_listener("dispatcher_wake", lambda *args: heard.append(args[-1]))
        await enqueue_now(conn, "no-daemon", target)
        await conn.execute("NOTIFY dispatcher_wake, 'sentinel'")  # delivered in commit order
        await wait_until(lambda: "sentinel" in heard, what="the sentinel notice")
        assert heard == ["sentinel"], "intake notified with no daemon listening"

        await spawn(env)
        await target.wait_for(lambda t: "no-daemon" in t.request_keys(), what="its start")
    finally:
        await conn.close()
