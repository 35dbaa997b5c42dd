"""Wake-ups from the SQL door's NOTIFY, in process, real PostgreSQL: no wake-up is lost.

The idle poll and the due-scan interval are an hour here, so a job that starts was started by
its notice alone. The notice of a job committed while a claim is in flight (that claim's
snapshot cannot see it) must lead to another claim, whether the claim in flight found work or
not. Since the queue wake gates, the job notifies only while the loop waits for work (held
its gate before the claim); a loop that claims again at once finds it by its look after taking
the gate instead, and either way it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from dispatcher.engine.queue_worker import QueueWorker
from dispatcher.model import ByteGrant
from dispatcher.relay.transport import Delivery, InProcessTransport
from tests.db.test_wake_gate import LISTENER_WAITS
from tests.harness import make_settings, running_daemon, wait_until

STARTED: list[str] = []
SENTINEL = "test_wakeups_sentinel"  # a channel of its own: the daemon does not hear it
# the notices that wake the default queue's loop (engine/work_poll.py Wakeups): another
# notice heard meanwhile ('scheduled', 'limits') is not the one 'late' sent
WAKES_THE_WORKER = {"ready:default", "ready", ""}


async def record(job: Any, ctx: Any) -> None:
    STARTED.append(job.key)


class ClaimHook:
    """Around every in-process claim: once armed, the first claim whose result matches runs
    `during` after its statement returned and before the claim loop sees the result."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.woken = asyncio.Event()
        self.armed_for: str | None = None  # "empty" or "jobs"
        self.fired = asyncio.Event()
        self.conn: asyncpg.Connection | None = None  # its own: the test's may be busy
        self.notified = False  # whether the job committed during the claim sent a notice
        self.stage = "armed, no claim of the kind armed for yet"  # said when the test fails
        receive, wake = InProcessTransport.receive, QueueWorker.wake

        async def hooked(
            transport: InProcessTransport, queue: str, limit: int, grant: ByteGrant
        ) -> Delivery:
            delivery = await receive(transport, queue, limit, grant)
            if self.armed_for == ("jobs" if delivery.jobs else "empty"):
                self.armed_for = None
                self.stage = f"a claim found {[job.key for job in delivery.jobs]}"
                await self.during()
                self.fired.set()
            return delivery

        def woken(worker: QueueWorker) -> None:
            wake(worker)
            self.woken.set()

        monkeypatch.setattr(InProcessTransport, "receive", hooked)
        monkeypatch.setattr(QueueWorker, "wake", woken)

    async def during(self) -> None:
        """Commit a due job through the SQL door and, when it notified (the loop held its
        queue's wake gate: it was waiting before this claim), wait until the notice woke the
        worker. A loop that claimed again at once (busy) holds no gate, gets no notice, and
        must find the job by its look after taking the gate (engine/wake_gates.py)."""
        assert self.conn is not None
        self.woken.clear()
        heard: list[str] = []
        sentinel = asyncio.Event()

        def hear(_c: object, _pid: object, channel: str, payload: str) -> None:
            if channel == SENTINEL:
                sentinel.set()
            elif payload in WAKES_THE_WORKER:
                heard.append(payload)

        await self.conn.add_listener("dispatcher_wake", hear)
        await self.conn.add_listener(SENTINEL, hear)
        try:
            self.stage += "; enqueueing 'late'"
            await self.conn.execute("SELECT dispatcher.enqueue('late', 'record')")
            # notices reach a listener in commit order, whatever their channel
            await self.conn.execute(f"NOTIFY {SENTINEL}")
            self.stage += "; waiting for the sentinel"
            await sentinel.wait()
            if heard:
                self.notified = True
                self.stage += f"; 'late' notified {heard}: waiting for the worker's wake-up"
                await self.woken.wait()
            self.stage += "; done"
        finally:
            await self.conn.remove_listener("dispatcher_wake", hear)
            await self.conn.remove_listener(SENTINEL, hear)


@contextlib.asynccontextmanager
async def hooked_daemon_with(
    db_url: str, monkeypatch: pytest.MonkeyPatch, **queue: Any
) -> AsyncIterator[tuple[ClaimHook, asyncpg.Connection]]:
    STARTED.clear()
    hook = ClaimHook(monkeypatch)
    settings = make_settings(
        db_url,
        scan_interval_s=3600,
        handlers={"record": {"kind": "python", "function": f"{__name__}:record"}},
        queues={"default": queue},
    )
    conn = await asyncpg.connect(db_url)
    hook.conn = await asyncpg.connect(db_url)
    try:
        async with running_daemon(settings):
            yield hook, conn
    finally:
        await conn.close()
        await hook.conn.close()


@pytest.fixture
async def hooked_daemon(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[ClaimHook, asyncpg.Connection]]:
    async with hooked_daemon_with(db_url, monkeypatch) as hooked:
        yield hooked


@pytest.mark.parametrize("claim_in_flight", ["empty", "jobs"])
async def test_a_notice_during_a_claim_leads_to_another_claim(
    hooked_daemon: tuple[ClaimHook, asyncpg.Connection], claim_in_flight: str
) -> None:
    hook, conn = hooked_daemon
    # "first" wakes the loop; its claim finds it and the claim after it finds nothing
    hook.armed_for = claim_in_flight
    await conn.execute("SELECT dispatcher.enqueue('first', 'record')")
    try:
        async with asyncio.timeout(20):
            await hook.fired.wait()
    except TimeoutError:
        raise AssertionError(f"after 20 s: {hook.stage}; started {STARTED}") from None
    await wait_until(lambda: sorted(STARTED) == ["first", "late"], what="both jobs started")


async def test_notices_alone_start_a_stream_of_due_jobs(
    hooked_daemon: tuple[ClaimHook, asyncpg.Connection],
) -> None:
    _, conn = hooked_daemon
    keys = [f"stream-{i}" for i in range(200)]
    for key in keys:
        await conn.execute("SELECT dispatcher.enqueue($1, 'record')", key)
    await wait_until(lambda: sorted(STARTED) == sorted(keys), what="200 jobs started")


async def test_a_claim_short_of_its_batch_claims_again_while_ready_jobs_are_left(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claims of 10 share among tenants: with 30 ready jobs of one tenant and 1 of another, the
    first claim takes 5 + 1 and fewer than it asked; 25 are left that no notice announces."""
    async with hooked_daemon_with(db_url, monkeypatch, claim_batch=10) as (_, conn):
        keys = [f"a-{i}" for i in range(30)] + ["b-0"]
        async with conn.transaction():  # one notice for all of them, at the commit
            for key in keys:
                await conn.execute(
                    "SELECT dispatcher.enqueue($1, 'record', tenant => $2)", key, key[0]
                )
        await wait_until(lambda: sorted(STARTED) == sorted(keys), what="31 jobs started")


@pytest.mark.parametrize("due_in_s", [0, 2], ids=["due-now", "due-later"])
async def test_an_enqueue_open_while_the_daemon_takes_its_gate_starts_once_it_commits(
    db_url: str, due_in_s: int
) -> None:
    """An enqueue that probed the daemon gate before any daemon held it sent no notice (neither
    'ready:<queue>' nor 'scheduled') and took no intake lock. The listener, once it holds its
    gates, waits for the transactions open then before its look for what was missed
    (db/notifications.py), so the job committed meanwhile is found. Without that wait the look
    comes first and misses it: the idle poll is an hour and the due-scan's safety round 30 s,
    so nothing else would find it within the test's 10 s."""
    STARTED.clear()
    settings = make_settings(
        db_url,
        scan_interval_s=3600,
        handlers={"record": {"kind": "python", "function": f"{__name__}:record"}},
    )
    conn = await asyncpg.connect(db_url)
    watcher = await asyncpg.connect(db_url)
    try:
        await conn.execute(
            "INSERT INTO dispatcher.handlers (name, kind) VALUES ('record', 'python')"
        )
        enqueue = conn.transaction()
        await enqueue.start()
        await conn.execute(  # nobody listens: no notice
            "SELECT dispatcher.enqueue('first', 'record', due_at => now() + make_interval("
            "secs => $1))",
            due_in_s,
        )
        async with running_daemon(settings):
            await wait_until(
                lambda: watcher.fetchval(LISTENER_WAITS),
                what="the listener waits for the open enqueue",
            )
            await enqueue.commit()  # within its bound (OPEN_WAIT_S)
            await wait_until(lambda: STARTED == ["first"], timeout_s=10, what="'first' started")
    finally:
        await conn.close()
        await watcher.close()
