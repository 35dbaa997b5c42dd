"""The liveness lock: how other daemons learn within seconds that this one died (recovery.md).

A daemon holds a session-level advisory lock named by its lease owner id on one connection of
its own, from before its first claim until after its last lease is handed back (migration 022).
PostgreSQL releases the lock when that session ends, and it ends when the process's socket
closes, at once after a SIGKILL or an OOM kill; a frozen process (SIGSTOP) keeps its socket and
so its lock. The same connection looks about every second at the other registered daemons and
reports to the judge (engine/gone_owners.py), whose verdict the due-scan acts on.

Keepalives are asked of the server on this connection, so a host that vanishes without closing
its sockets (power loss, a partition) loses its lock in about 25 s instead of the kernel's two
hours; that is still sooner than most leases.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import Protocol

import asyncpg

from dispatcher.config.settings import Settings
from dispatcher.db.pool import RECONNECT_ERRORS
from dispatcher.db.queries import query
from dispatcher.errors import DispatcherError
from dispatcher.observability import metrics
from dispatcher.runtime.lifecycle import Service

log = logging.getLogger(__name__)

LOOK_EVERY_S = 0.5
LOOK_TIMEOUT_S = 2.0
RECONNECT_MAX_S = 1.0
LOG_EVERY_S = 5.0
SERVER_SETTINGS = {
    "application_name": "dispatcher:liveness",  # a daemon's session (restore refuses to run)
    "tcp_keepalives_idle": "10",
    "tcp_keepalives_interval": "5",
    "tcp_keepalives_count": "3",
}
POOLER_HINT = (
    "the liveness lock needs a session of its own: a pooler in transaction or statement mode "
    "(PgBouncer pool_mode=transaction) moves statements between server sessions; point "
    "DISPATCHER_DATABASE_URL at PostgreSQL itself or at a session-mode pool (docs/recovery.md)"
)


class Judge(Protocol):
    """What the lock reports to (scheduling.gone_owners.GoneOwners)."""

    def observe(self, absent: Iterable[str], server_uptime_s: float) -> list[str]: ...

    def lock_lost(self) -> None: ...

    def lock_taken(self) -> None: ...


class LivenessLockError(DispatcherError):
    """The lock could not be taken at start; the message says why and what to do."""


class _SessionMoved(Exception):
    """A look ran on another server session than the one holding the lock."""


class LivenessLock(Service):
    """Holds this daemon's liveness lock and watches the others'. Start: connect, take the lock,
    register (refused in one line when the lock cannot be taken). While running: a look every
    `LOOK_EVERY_S`; a look that fails drops the connection and takes the lock again on a new
    one, as soon as the server lets it. Stop: unregister and close, which releases the lock."""

    name = "liveness-lock"

    def __init__(self, dsn: str, owner: str, judge: Judge, on_gone: Callable[[], None]) -> None:
        self._dsn = dsn
        self._owner = owner
        self._judge = judge
        self._on_gone = on_gone
        self._conn: asyncpg.Connection | None = None
        self._pid = 0
        self._lost_at: float | None = None  # monotonic time the lock was lost, while it is
        self._task: asyncio.Task[None] | None = None

    def problem(self) -> str | None:
        """For /readyz: None while the lock is held."""
        if self._lost_at is None:
            return None
        return (
            f"liveness lock lost {time.monotonic() - self._lost_at:.0f} s ago, reconnecting "
            "(other daemons may rescue this daemon's running jobs)"
        )

    async def start(self) -> None:
        self._stopping = False
        try:
            held = await self._take()
        except RECONNECT_ERRORS as exc:
            raise LivenessLockError(
                f"could not take the liveness lock: {type(exc).__name__}: {exc}"
            ) from None
        if not held:
            await self._close()
            raise LivenessLockError(
                f"the liveness lock of {self._owner} is held by another session (two owner ids "
                "with one hash, or a pooler sharing sessions); start again to draw another "
                "owner id. " + POOLER_HINT
            )
        metrics.LIVENESS_LOCK_HELD.set(1)
        self._task = self.spawn(self._run())

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._conn is not None and self._lost_at is None:
            with contextlib.suppress(Exception):  # a registry row left behind costs one look
                async with asyncio.timeout(LOOK_TIMEOUT_S):
                    await self._conn.execute(query("liveness_unregister"), self._owner)
        await self._close()
        metrics.LIVENESS_LOCK_HELD.set(0)

    async def _take(self) -> bool:
        """Connect, take the lock and register; whether the lock is ours."""
        await self._close()
        self._conn = await asyncpg.connect(
            self._dsn, timeout=LOOK_TIMEOUT_S, server_settings=SERVER_SETTINGS
        )
        async with asyncio.timeout(LOOK_TIMEOUT_S):
            row = await self._conn.fetchrow(query("liveness_take"), self._owner)
            self._pid = row["pid"]
            # a pooler in transaction mode hands the next statement to another session
            if await self._conn.fetchval("SELECT pg_backend_pid()") != self._pid:
                raise LivenessLockError(POOLER_HINT)
        return bool(row["held"])

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            try:
                await conn.close(timeout=LOOK_TIMEOUT_S)
            except Exception:
                conn.terminate()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(LOOK_EVERY_S)
            try:
                await self._look()
            except RECONNECT_ERRORS as exc:
                await self._retake(f"{type(exc).__name__}: {exc}")
            except _SessionMoved:
                await self._retake(POOLER_HINT)

    async def _look(self) -> None:
        assert self._conn is not None
        async with asyncio.timeout(LOOK_TIMEOUT_S):
            row = await self._conn.fetchrow(query("liveness_look"), self._owner)
        if row["pid"] != self._pid:
            raise _SessionMoved
        if self._judge.observe(row["absent"], row["uptime_s"]):
            self._on_gone()

    async def _retake(self, reason: str) -> None:
        """The lock's session is gone or unusable: take the lock again on a new connection,
        retrying at once and then every second at most, saying so every few seconds."""
        self._lost_at = time.monotonic()
        metrics.LIVENESS_LOCK_HELD.set(0)
        self._judge.lock_lost()
        log.error(
            "liveness lock lost (%s); taking it again. Until then other daemons may judge "
            "this one gone and rescue its running jobs (their attempts here then change "
            "nothing)",
            reason,
        )
        delay, last_log = 0.0, time.monotonic()
        while True:
            await asyncio.sleep(delay)
            try:
                if await self._take():
                    break
                reason = "held by an earlier session of this daemon the server has not ended"
            except RECONNECT_ERRORS as exc:
                reason = f"{type(exc).__name__}: {exc}"
            except LivenessLockError as exc:
                reason = str(exc)
            if time.monotonic() - last_log >= LOG_EVERY_S:
                last_log = time.monotonic()
                log.error(
                    "liveness lock still not held after %.0f s: %s",
                    last_log - self._lost_at,
                    reason,
                )
            delay = min(max(delay * 2, 0.1), RECONNECT_MAX_S)
        log.warning("liveness lock taken again after %.1f s", time.monotonic() - self._lost_at)
        self._lost_at = None
        metrics.LIVENESS_LOCK_HELD.set(1)
        self._judge.lock_taken()


def liveness_lock(
    settings: Settings, dsn: str, owner: str, judge: Judge, on_gone: Callable[[], None]
) -> LivenessLock | None:
    """The liveness lock needs a session of its own, which a transaction pooler never gives:
    with `wakeups = "poll"` there is none, and a dead daemon's jobs wait for their leases."""
    if settings.database.wakeups == "poll":
        log.warning(
            "database.wakeups = poll: no liveness lock (it needs a session of its own); the "
            "running jobs of a daemon that dies are rescued when their leases expire, "
            "lease_s = %.0f s (docs/pooling.md)",
            settings.lease_s,
        )
        return None
    return LivenessLock(dsn, owner, judge, on_gone=on_gone)
