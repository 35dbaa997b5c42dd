"""The wake gates (db/functions/10_wake.sql, db/notifications.py), on real PostgreSQL: intake
sends NOTIFY only while a daemon's wake-up listener holds the gate it probes (the daemon gate
for new due times and notices naming no queue, a queue's gate, held for a claim loop that waits,
for a job ready now), every listener holds them, they go with the listener's session, and a
loop's look after taking a queue's gate waits for the enqueues that probed before it.

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

from dispatcher.db.notifications import CHANNEL, OLDER_OPEN, WakeListener
from tests.harness import wait_until

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


async def test_a_listening_daemon_hears_new_due_times_but_no_ready_intake_while_no_loop_waits(
    db_url: str, conn: asyncpg.Connection, notices: Notices
) -> None:
    async with listening(db_url) as woken:
        assert await conn.fetchval("SELECT dispatcher.wake_gate_held()")
        assert not await conn.fetchval("SELECT dispatcher.wake_gate_held('default')")
        # no claim loop waits (a busy daemon): a job ready now commits without a notice
        assert await notices.sent_by(conn, ENQUEUE_NOW, "now") == []
        assert await notices.sent_by(conn, ENQUEUE_LATER, "later") == ["scheduled"]
        assert await next_wake(woken) == "scheduled"
        assert await notices.sent_by(conn, ENQUEUE_BATCH, "batch") == ["ready"]  # no queue named
        assert await next_wake(woken) == "ready"
    # stopped: its session ended, and the gate with it
    assert not await conn.fetchval("SELECT dispatcher.wake_gate_held()")
    assert await notices.sent_by(conn, ENQUEUE_LATER, "after") == []


@contextlib.asynccontextmanager
async def listener_of(db_url: str) -> AsyncIterator[tuple[WakeListener, asyncio.Queue[str]]]:
    """`listening`, with the listener itself (its queue gates)."""
    woken: asyncio.Queue[str] = asyncio.Queue()
    listener = WakeListener(db_url, woken.put_nowait, reconnect_s=0.1)
    await listener.start()
    try:
        async with asyncio.timeout(NOTICE_S):
            assert await woken.get() == ""
        yield listener, woken
    finally:
        await listener.stop()


async def test_a_waiting_loop_hears_its_queue_alone_until_it_is_busy(
    db_url: str, conn: asyncpg.Connection, notices: Notices
) -> None:
    await conn.execute(
        "INSERT INTO dispatcher.queues (name, max_attempts, max_retry_age_s)"
        " VALUES ('other', 10, 86400)"
    )
    async with listener_of(db_url) as (listener, woken):
        assert await listener.hold_gate("default")  # newly taken: the loop must look once more
        assert not await listener.hold_gate("default")  # held and looked after: no second take
        assert await conn.fetchval("SELECT dispatcher.wake_gate_held('default')")
        assert await notices.sent_by(conn, ENQUEUE_NOW, "now") == ["ready:default"]
        assert await next_wake(woken) == "ready:default"
        other = "SELECT dispatcher.enqueue($1, 'work', queue => 'other')"
        assert await notices.sent_by(conn, other, "other-queue") == []  # not its queue's gate
        listener.let_go("default")  # busy: the gate goes back in the background

        async def released() -> bool:
            return not await conn.fetchval("SELECT dispatcher.wake_gate_held('default')")

        await wait_until(released, what="the gate given back")
        assert await notices.sent_by(conn, ENQUEUE_NOW, "busy") == []
        assert await listener.hold_gate("default")  # taken again: look again


async def test_a_gate_wanted_again_while_it_is_being_let_go_stays_held(
    db_url: str, conn: asyncpg.Connection
) -> None:
    """A loop busy for one claim lets its gate go in the background; waiting again before that
    let-go has run must not leave it waiting on a gate given back behind it."""
    async with listener_of(db_url) as (listener, _):
        for turn in range(20):  # the let-go at each stage of its round trip
            assert await listener.hold_gate("default") in (True, False)
            listener.let_go("default")
            for _ in range(turn % 4):
                await asyncio.sleep(0)
            await listener.hold_gate("default")
            await listener.hold_gate("default")  # after any let-go still under way
            assert await conn.fetchval("SELECT dispatcher.wake_gate_held('default')")


async def test_over_rabbitmq_every_ready_intake_takes_the_daemon_gate(
    db_url: str, conn: asyncpg.Connection, notices: Notices
) -> None:
    """An idle relay waits for ready work: no claim loop's gate decides for it."""
    await conn.execute("UPDATE dispatcher.intake_settings SET ready_outbox = true")
    assert await notices.sent_by(conn, ENQUEUE_NOW, "nobody") == []
    async with listening(db_url) as woken:
        assert await notices.sent_by(conn, ENQUEUE_NOW, "now") == ["ready"]
        assert await next_wake(woken) == "ready"


CAPS = ["work:1"]


async def test_the_look_after_the_gate_waits_for_an_enqueue_that_probed_before_it(
    db_url: str, conn: asyncpg.Connection, notices: Notices
) -> None:
    """The race: an enqueue probes (no loop waits: no notice), a loop then takes the gate and
    looks, and the enqueue commits after the look. The look waits for that commit."""
    looker = await asyncpg.connect(db_url)
    try:
        async with listener_of(db_url) as (listener, woken):
            async with conn.transaction():
                await conn.execute(ENQUEUE_NOW, "in-flight")  # probed: no loop waits yet
                assert await listener.hold_gate("default")
                look = asyncio.ensure_future(
                    looker.fetchval("SELECT dispatcher.ready_after_intake('default', $1)", CAPS)
                )
                await wait_until(
                    lambda: waiting_for_lock(conn), what="the look waiting for the intake lock"
                )
                assert not look.done()
                # meanwhile another enqueue is refused the intake lock: it notifies
                other = await asyncpg.connect(db_url)
                try:
                    assert await notices.sent_by(other, ENQUEUE_NOW, "during") == ["ready:default"]
                finally:
                    await other.close()
            async with asyncio.timeout(NOTICE_S):
                assert await look is True  # it saw the job committed after it began to wait
            while not woken.empty():  # the notice of "during"
                assert (await woken.get()) in ("ready:default", "sentinel")
            # nothing in flight: the look answers at once, and it sees no ready job of `other`
            assert (
                await looker.fetchval("SELECT dispatcher.ready_after_intake('nothing', $1)", CAPS)
                is False
            )
    finally:
        await looker.close()


async def waiting_for_lock(conn: asyncpg.Connection) -> bool:
    waiting: int = await conn.fetchval(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        " AND classid = 1684632425"
    )
    return waiting > 0


async def test_the_look_gives_up_on_an_enqueue_left_open_and_says_claim_again(
    db_url: str, conn: asyncpg.Connection
) -> None:
    """A business transaction that enqueued and stays open: the look waits at most its bound
    (1 s), then answers NULL (claim again, and come back) rather than hold a claim connection."""
    looker = await asyncpg.connect(db_url)
    try:
        async with listener_of(db_url), conn.transaction():  # a daemon listens: no loop waits
            await conn.execute(ENQUEUE_NOW, "left-open")
            async with asyncio.timeout(NOTICE_S):
                assert (
                    await looker.fetchval(
                        "SELECT dispatcher.ready_after_intake('default', $1)", CAPS
                    )
                    is None
                )
    finally:
        await looker.close()


INTAKE_LOCKS = """
    SELECT count(*) FROM pg_locks
     WHERE locktype = 'advisory' AND granted AND classid = 1684632425
       AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"""


async def test_with_no_daemon_listening_an_enqueue_holds_no_intake_lock(
    db_url: str, conn: asyncpg.Connection
) -> None:
    """The intake lock only serves a loop that may take its queue's gate, and every such loop
    runs in a listening daemon: with none, an enqueue takes no lock until its commit (that one
    lock, held shared by every enqueue, cost one-per-call intake a third). With one, it does."""
    async with conn.transaction():
        await conn.execute(ENQUEUE_NOW, "no-daemon")
        assert await conn.fetchval(INTAKE_LOCKS) == 0
    async with listener_of(db_url), conn.transaction():
        await conn.execute(ENQUEUE_NOW, "a-daemon")
        assert await conn.fetchval(INTAKE_LOCKS) == 1


async def test_every_listener_holds_the_gate_and_the_survivor_still_hears(
    db_url: str, conn: asyncpg.Connection, notices: Notices
) -> None:
    async with listener_of(db_url) as (survivor, heard):
        assert await survivor.hold_gate("default")
        async with listener_of(db_url) as (other, _):
            assert await other.hold_gate("default")
            assert await conn.fetchval(HOLDERS) == 2
            assert await conn.fetchval(QUEUE_HOLDERS) == 2
        assert await conn.fetchval(HOLDERS) == 1  # nothing to take over: it held it already
        assert await conn.fetchval(QUEUE_HOLDERS) == 1
        assert await notices.sent_by(conn, ENQUEUE_NOW, "one") == ["ready:default"]
        assert await next_wake(heard) == "ready:default"


QUEUE_HOLDERS = """
    SELECT count(*) FROM pg_locks
     WHERE locktype = 'advisory' AND granted AND classid = 1684632433
       AND objid = hashtext('default')::oid
       AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"""


async def test_a_listener_whose_session_is_killed_takes_its_gates_again(
    db_url: str, conn: asyncpg.Connection, notices: Notices
) -> None:
    async with listener_of(db_url) as (listener, woken):
        assert await listener.hold_gate("default")
        killed = await conn.fetchval(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'dispatcher:wake-listener' AND datname = current_database()"
        )
        assert killed
        # reconnected: LISTEN, the gates, then the look for what was missed ("")
        assert await next_wake(woken) == ""
        assert await conn.fetchval(HOLDERS) == 1
        assert await conn.fetchval(QUEUE_HOLDERS) == 1  # the loop still waits: taken again
        assert await listener.hold_gate("default")  # taken anew: the loop looks once more
        assert await notices.sent_by(conn, ENQUEUE_NOW, "again") == ["ready:default"]
        assert await next_wake(woken) == "ready:default"


# whether a listener of this database waits for the transactions open once it held its gates
# (its last statement is the question it asks until they have ended)
LISTENER_WAITS = f"""
    SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                    WHERE application_name = 'dispatcher:wake-listener'
                      AND datname = current_database() AND query = '{OLDER_OPEN}')"""


async def test_a_reconnecting_listener_looks_once_an_enqueue_made_while_it_was_down_commits(
    db_url: str, conn: asyncpg.Connection
) -> None:
    """While the listener is down nobody holds the daemon gate, so an enqueue then sends no
    notice and takes no intake lock. Back, the listener waits for that transaction before its
    look for what was missed (""), so the look comes after the commit and sees the job."""
    woken: asyncio.Queue[str] = asyncio.Queue()
    listener = WakeListener(db_url, woken.put_nowait, reconnect_s=1.0)
    enqueuer = await asyncpg.connect(db_url)
    await listener.start()
    try:
        assert await next_wake(woken) == ""
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'dispatcher:wake-listener' AND datname = current_database()"
        )

        async def gate_free() -> bool:
            return bool(await conn.fetchval(HOLDERS) == 0)

        await wait_until(gate_free, what="the gate free while the listener is down")
        enqueue = enqueuer.transaction()
        await enqueue.start()
        await enqueuer.execute(ENQUEUE_NOW, "while-down")  # the gate is free: no notice
        await wait_until(lambda: conn.fetchval(LISTENER_WAITS), what="the listener waits for it")
        assert woken.empty(), "looked before the open enqueue ended"
        await enqueue.commit()
        assert await next_wake(woken) == ""
    finally:
        await listener.stop()
        await enqueuer.close()


async def test_an_open_enqueue_transaction_does_not_keep_a_daemon_from_the_gate(
    db_url: str, conn: asyncpg.Connection
) -> None:
    """The probe gives its lock back at once: a business transaction that enqueued (and found
    no listener) and stays open does not hold the gate against a daemon starting meanwhile,
    and the listener's wait for it before its first look is bounded (`OPEN_WAIT_S`): the look
    ("", which `listening` waits for) comes while it is still open."""
    async with conn.transaction():
        await conn.execute(ENQUEUE_NOW, "in-flight")
        async with listening(db_url):  # within its lock_timeout, or this fails
            assert await conn.fetchval(HOLDERS) == 1


async def test_wake_refuses_an_unknown_reason(conn: asyncpg.Connection) -> None:
    with pytest.raises(asyncpg.InvalidParameterValueError, match="unknown reason") as caught:
        await conn.execute("SELECT dispatcher.wake('limits')")
    assert "'ready'" in (caught.value.hint or "")
