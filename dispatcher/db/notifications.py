"""LISTEN for wake-ups from other instances and from the SQL door (channel `dispatcher_wake`),
and the start-up check that the database URL keeps a session, without which LISTEN hears
nothing (docs/pooling.md).

The listener connection also holds the wake gate (db/functions/10_wake.sql): `dispatcher.wake`
sends NOTIFY only while some session holds it, because a transaction that notifies commits
behind every other notifier. The gate is taken after LISTEN and before the first look for work:
a job committed before the look is found by it, and an enqueue that probes the gate after it is
taken notifies, and is heard. One that probed before and commits after the look (a transaction
in flight while the first daemon starts) is found by the work poll, within `scan_interval_s`.
Every listening daemon holds the gate (a shared lock), so when one dies the others hold it
already and nothing is taken over; a listener that reconnects takes it again."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import asyncpg

from dispatcher.db.pool import POOLER_FIX, RECONNECT_ERRORS, PoolerError
from dispatcher.runtime.lifecycle import LoopService

log = logging.getLogger(__name__)

CHANNEL = "dispatcher_wake"
CHECK_TIMEOUT_S = 2.0


async def check_sessions_stay(dsn: str) -> None:
    """Raise PoolerError when consecutive statements of one connection may run in different
    server sessions. One connection reads its backend pid; a second one opens a transaction,
    which a transaction pooler serves with the server session just freed (PgBouncer hands out
    the most recently used); the first reads its pid again. A direct connection or a
    session-mode pool gives the same pid; a transaction pooler another one, or none until the
    transaction ends (a pool of one server session). No statement cache: a named prepared
    statement would itself fail behind such a pooler."""
    options = {"application_name": "dispatcher:session-check"}
    first = await asyncpg.connect(dsn, statement_cache_size=0, server_settings=options)
    second = await asyncpg.connect(dsn, statement_cache_size=0, server_settings=options)
    try:
        pid = await first.fetchval("SELECT pg_backend_pid()")
        async with second.transaction():
            await second.fetchval("SELECT pg_backend_pid()")
            try:
                async with asyncio.timeout(CHECK_TIMEOUT_S):
                    again = await first.fetchval("SELECT pg_backend_pid()")
            except TimeoutError:
                again = None
        if again != pid:
            raise PoolerError(POOLER_FIX)
    finally:
        for conn in (first, second):
            conn.terminate()


class WakeListener(LoopService):
    """Holds one connection LISTENing, and the wake gate on it; reconnects when it drops.

    Calls `on_wake(payload)` per notice: "ready" (work to claim), "scheduled" (a new due time),
    or "" (anything may have changed).
    """

    name = "wake-listener"

    def __init__(self, dsn: str, on_wake: Callable[[str], None], reconnect_s: float = 1.0):
        self._dsn = dsn
        self._on_wake = on_wake
        self._reconnect_s = reconnect_s

    async def _run(self) -> None:
        failing = False  # said once per episode: a full server refuses every second for long
        while True:
            conn = None
            try:
                conn = await asyncpg.connect(
                    self._dsn, server_settings={"application_name": "dispatcher:wake-listener"}
                )
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _c, lost=lost: lost.set())
                await conn.add_listener(CHANNEL, lambda *args: self._on_wake(args[-1]))
                # after LISTEN: from here on every wake-up sent is heard (the wait is bounded
                # in the function: a gate it cannot have is an error, and a reconnect)
                await conn.execute("SELECT dispatcher.hold_wake_gate()")
                if failing:
                    log.warning("wake-up listener connected again")
                    failing = False
                self._on_wake("")  # notices sent while we were not listening are lost: look now
                await lost.wait()
                log.warning("wake-up listener connection lost; reconnecting")
            except RECONNECT_ERRORS as exc:
                if not failing:
                    log.warning(
                        "wake-up listener cannot connect or listen (retrying every %.0f s): %s",
                        self._reconnect_s,
                        exc,
                    )
                failing = True
            finally:
                if conn is not None and not conn.is_closed():
                    with contextlib.suppress(Exception):
                        await conn.close(timeout=2)
            await asyncio.sleep(self._reconnect_s)
