"""The wake gate (db/functions/10_wake.sql, db/notifications.py), on real PostgreSQL: intake
sends NOTIFY only while a daemon's wake-up listener holds the gate, every listener holds it, and
it goes with the listener's session.

Whether a notice was sent is read without a timer: after the statement under test commits, a
plain `NOTIFY dispatcher_wake, 'sentinel'` follows; PostgreSQL delivers notices in commit
order, so what arrives before the sentinel is exactly what the statement sent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import asyncpg
import pytest

from dispatcher.db.notifications import CHANNEL, WakeListener

NOTICE_S = 10.0
HOLDERS = """
    SELECT count(*) FROM pg_locks
     WHERE locktype = 'advisory' AND granted AND classid = 1684632439 AND objid = 0
       AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"""


class Notices:
    """A plain LISTENing connection (it holds no gate) that collects every notice."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.heard: asyncio.Queue[str] = asyncio.Queue()

    async def sent_by(self, conn: asyncpg.Connection, statement: str, *args: object) -> list[str]:
        """Run `statement` on `conn` (its own transaction) and return the notices it sent."""
        await conn.execute(statement, *args)
        await conn.execute(f"NOTIFY {CHANNEL}, 'sentinel'")
        got: list[str] = []
        async with asyncio.timeout(NOTICE_S):
            while (notice := await self.heard.get()) != "sentinel":
                got.append(notice)
        return got


@pytest.fixture
async def notices(db_url: str) -> AsyncIterator[Notices]:
    conn = await asyncpg.connect(db_url)
    found = Notices(conn)
    await conn.add_listener(CHANNEL, lambda *args: found.heard.put_nowait(args[-1]))
    try:
        yield found
    finally:
        await conn.close()


@pytest.fixture
async def conn(db_url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(db_url)
    await connection.execute(
        "INSERT INTO dispatcher.handlers (name, kind) VALUES ('work', 'python')"
        " ON CONFLICT DO NOTHING"
    )
    try:
        yield connection
    finally:
        await connection.close()


@contextlib.asynccontextmanager
async def listening(db_url: str) -> AsyncIterator[asyncio.Queue[str]]:
    """A running WakeListener (the daemon's own service) whose wake-ups land in a queue; yields
    once it listens and holds the gate (its first wake-up, "", comes after both)."""
    woken: asyncio.Queue[str] = asyncio.Queue()
    listener = WakeListener(db_url, woken.put_nowait, reconnect_s=0.1)
    await listener.start()
    try:
        async with asyncio.timeout(NOTICE_S):
            assert await woken.get() == ""
        yield woken
    finally:
        await listener.stop()


async def next_wake(woken: asyncio.Queue[str]) -> str:
    """The listener's next wake-up, past the test's own sentinels."""
    async with asyncio.timeout(NOTICE_S):
        while (reason := await woken.get()) == "sentinel":
            pass
        return reason


ENQUEUE_NOW = "SELECT dispatcher.enqueue($1, 'work')"
ENQUEUE_LATER = "SELECT dispatcher.enqueue($1, 'work', due_at => now() + interval '1 hour')"
ENQUEUE_BATCH = (
    "SELECT count(*) FROM dispatcher.enqueue_many(ARRAY[$1 || '-a', $1 || '-b'],"
    " ARRAY['work', 'work'], ARRAY['{}', '{}']::jsonb[])"
)


async def test_with_no_daemon_listening_intake_sends_no_notice(
    conn: asyncpg.Connection, notices: Notices
) -> None:
    assert not await conn.fetchval("SELECT dispatcher.wake_gate_held()")
    assert await notices.sent_by(conn, ENQUEUE_NOW, "now") == []
    assert await notices.sent_by(conn, ENQUEUE_LATER, "later") == []
    assert await notices.sent_by(conn, ENQUEUE_BATCH, "batch") == []
    assert await notices.sent_by(conn, "SELECT dispatcher.wake('ready')") == []
    # the probe gave its lock back: the enqueuing session holds nothing afterwards
    assert await conn.fetchval(HOLDERS) == 0


async def test_a_listening_daemon_hears_every_intake(
    db_url: str, conn: asyncpg.Connection, notices: Notices
) -> None:
    async with listening(db_url) as woken:
        assert await conn.fetchval("SELECT dispatcher.wake_gate_held()")
        assert await notices.sent_by(conn, ENQUEUE_NOW, "now") == ["ready"]
        assert await next_wake(woken) == "ready"
        assert await notices.sent_by(conn, ENQUEUE_LATER, "later") == ["scheduled"]
        assert await next_wake(woken) == "scheduled"
        assert await notices.sent_by(conn, ENQUEUE_BATCH, "batch") == ["ready"]
        assert await next_wake(woken) == "ready"
    # stopped: its session ended, and the gate with it
    assert not await conn.fetchval("SELECT dispatcher.wake_gate_held()")
    assert await notices.sent_by(conn, ENQUEUE_NOW, "after") == []


async def test_every_listener_holds_the_gate_and_the_survivor_still_hears(
    db_url: str, conn: asyncpg.Connection, notices: Notices
) -> None:
    async with listening(db_url) as survivor:
        async with listening(db_url):
            assert await conn.fetchval(HOLDERS) == 2
        assert await conn.fetchval(HOLDERS) == 1  # nothing to take over: it held it already
        assert await notices.sent_by(conn, ENQUEUE_NOW, "one") == ["ready"]
        assert await next_wake(survivor) == "ready"


async def test_a_listener_whose_session_is_killed_takes_the_gate_again(
    db_url: str, conn: asyncpg.Connection, notices: Notices
) -> None:
    async with listening(db_url) as woken:
        killed = await conn.fetchval(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'dispatcher:wake-listener' AND datname = current_database()"
        )
        assert killed
        # reconnected: LISTEN, the gate, then the look for what was missed ("")
        assert await next_wake(woken) == ""
        assert await conn.fetchval(HOLDERS) == 1
        assert await notices.sent_by(conn, ENQUEUE_NOW, "again") == ["ready"]
        assert await next_wake(woken) == "ready"


async def test_an_open_enqueue_transaction_does_not_keep_a_daemon_from_the_gate(
    db_url: str, conn: asyncpg.Connection
) -> None:
    """The probe gives its lock back at once: a business transaction that enqueued (and found
    no listener) and stays open does not hold the gate against a daemon starting meanwhile."""
    async with conn.transaction():
        await conn.execute(ENQUEUE_NOW, "in-flight")
        async with listening(db_url):  # within its lock_timeout, or this fails
            assert await conn.fetchval(HOLDERS) == 1


async def test_wake_refuses_an_unknown_reason(conn: asyncpg.Connection) -> None:
    with pytest.raises(asyncpg.InvalidParameterValueError, match="unknown reason") as caught:
        await conn.execute("SELECT dispatcher.wake('limits')")
    assert "'ready'" in (caught.value.hint or "")
