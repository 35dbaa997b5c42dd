"""Claims of every queue, on a few connections kept between claims and shared by all loops.

Why kept: a claim through the pool costs a second round trip before its rows reach the claim
loop: the pool resets a connection on release (`SELECT pg_advisory_unlock_all(); CLOSE ALL;
UNLISTEN *; RESET ALL`) and `pool.fetch` returns only after that. On loopback that is ~0.1 ms
per claim (a `SELECT 1` took 0.17 ms through the pool, 0.06 ms on a connection; 2 loaded
cores), paid twice per job of a steady stream of due-now jobs (the claim that finds the job and
the one after it that finds nothing).

Why shared: a connection kept per queue made a daemon's connections grow with its queues (60
queues held 66 connections idle; 120 queues ran the server out of connections). A claim is one
short statement, so `size` connections (the budget's `claims`, db/claims-pool) serve any number
of loops: a loop borrows one for a claim and gives it back, unreset, to the next loop.

The claim's plan is kept per connection: the statement runs in dispatcher.claim_ready
(db/functions/10_claim_ready.sql), whose plans are kept and whose reads of a job's rows go by
index whatever the statistics of the moment. Planned anew each time, as the pools plan everything
(`force_custom_plan`), it cost ~0.8 ms per claim, a third of a claim of one job; a plan kept
without the index guard, built on a nearly empty table, walked the jobs' tables sequentially, and
a claim of 1,000 after a burst took 544 ms instead of 12 ms (tests/db/test_claim_plan.py).

A connection whose statement failed goes back to the pool, which resets or drops it, so a
connection in an unknown state is never reused; one the server closed meanwhile is dropped
when next borrowed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence

import asyncpg

from dispatcher.db.jobs import Claim, ClaimCursors, claim_on
from dispatcher.db.pool import is_unavailable, translate_unavailable
from dispatcher.db.queries import query
from dispatcher.db.relay import Claimed, claim_delivered_on
from dispatcher.errors import ClaimsStarved
from dispatcher.model import UNBOUNDED, AttemptKey, ByteGrant
from dispatcher.runtime.lifecycle import Service

log = logging.getLogger(__name__)

_READY_LEFT = query("ready_left")
_READY_AFTER_INTAKE = query("ready_after_intake")

# A claim takes 1-30 ms; a loop that waited this long for one of the claim connections is
# starved (statements stuck behind locks, or far more loops than connections), not unlucky.
STARVED_AFTER_S = 5.0
# After the server refused a connection, borrowers that find none idle fail at once for this
# long instead of each asking the server again: 120 loops must not become 120 attempts a second.
REFUSED_RETRY_S = 1.0


class ClaimConnections(Service):
    """Up to `size` connections of `pool` (sized `size`), kept between claims and lent to one
    claim at a time. Invariant: at most `size` connections are open, whatever the number of
    queues. `problem()` says why loops cannot claim (None while they can); each episode is
    logged once when it begins and once when it ends. `stop()` hands the connections back."""

    name = "claim-connections"

    def __init__(self, pool: asyncpg.Pool, size: int):
        self._pool = pool
        self._size = size
        self._lent = asyncio.Semaphore(size)
        self._idle: list[asyncpg.Connection] = []
        self._problem: str | None = None
        self._since = 0.0
        self._refused_until = 0.0
        self._cursors = ClaimCursors()

    def problem(self) -> str | None:
        return self._problem

    @translate_unavailable
    async def claim(
        self,
        queue: str,
        limit: int,
        capabilities: list[str],
        owner: str,
        lease_s: float,
        grant: ByteGrant = UNBOUNDED,
    ) -> Claim:
        """As `JobRepository.claim_limited`."""
        async with self._borrow() as conn:
            return await claim_on(
                conn, queue, limit, capabilities, owner, lease_s, grant, self._cursors
            )

    @translate_unavailable
    async def ready_left(self, queue: str, capabilities: list[str]) -> bool:
        """Whether a ready job of `queue` this worker can run is left (locked or not).

        After a claim that took fewer jobs than it asked, claiming again at once finds nothing
        unless one is: a job committed after the claim began wakes the loop with its NOTIFY, but
        one the claim could not take (its tenant's share was full, or another claim held it)
        wakes nobody. This look took 0.25 ms where the claim that finds nothing took 1.1-1.3 ms
        (round trips on 2 loaded cores; most of the claim's is planning), and a steady stream of
        due-now jobs paid that claim once per job."""
        async with self._borrow() as conn:
            return bool(await conn.fetchval(_READY_LEFT, queue, capabilities))

    async def ready_after_intake(self, queue: str, capabilities: list[str]) -> bool | None:
        """`ready_left`, once every enqueue into `queue` that probed its wake gate before this
        loop took it has committed (db/functions/10_wake.sql): the look a claim loop takes
        after taking the gate, before it waits. None: such an enqueue is still open (1 s)."""
        async with self._borrow() as conn:
            ready: bool | None = await conn.fetchval(_READY_AFTER_INTAKE, queue, capabilities)
            return ready

    @translate_unavailable
    async def claim_delivered(
        self,
        queue: str,
        deliveries: Sequence[AttemptKey],
        capabilities: list[str],
        owner: str,
        lease_s: float,
        grant: ByteGrant = UNBOUNDED,
        messages: Sequence[int | None] = (),
        duplicates: Sequence[int | None] = (),
    ) -> Claimed:
        """As `RelayRepository.claim_delivered` (the RabbitMQ transport's claim)."""
        async with self._borrow() as conn:
            return await claim_delivered_on(
                conn, queue, deliveries, capabilities, owner, lease_s, grant, messages, duplicates
            )

    @contextlib.asynccontextmanager
    async def _borrow(self) -> AsyncIterator[asyncpg.Connection]:
        await self._wait_for_turn()
        try:
            conn = await self._kept_or_new()
            try:
                yield conn
            except BaseException:
                await self._give_back(conn)  # its state is unknown: reset or dropped
                raise
            if self._stopping:  # stop() handed the others back already
                await self._give_back(conn)
            else:
                self._idle.append(conn)
            self._fed()
        finally:
            self._lent.release()

    async def _wait_for_turn(self) -> None:
        try:
            async with asyncio.timeout(STARVED_AFTER_S):
                await self._lent.acquire()
                return
        except TimeoutError:
            self._starved(
                f"all {self._size} claim connections stayed busy for {STARVED_AFTER_S:.0f} s "
                "(database_max_connections; docs/connections.md)"
            )
        await self._lent.acquire()

    async def _kept_or_new(self) -> asyncpg.Connection:
        while self._idle:
            conn = self._idle.pop()
            if _open(conn):
                return conn
            await self._give_back(conn)  # the server closed it meanwhile: the pool drops it
        if time.monotonic() < self._refused_until and self._problem is not None:
            raise ClaimsStarved(self._problem)
        try:
            conn = await self._pool.acquire()
        except Exception as exc:
            if not is_unavailable(exc):
                raise
            self._refused_until = time.monotonic() + REFUSED_RETRY_S
            self._starved(f"claim loops cannot get a database connection: {_reason(exc)}")
            assert self._problem is not None
            raise ClaimsStarved(self._problem) from exc
        return conn

    def _starved(self, problem: str) -> None:
        if self._problem is None:
            log.error("%s; queues are not claimed until it clears", problem)
            self._since = time.monotonic()
        self._problem = problem

    def _fed(self) -> None:
        if self._problem is not None:
            log.warning(
                "claim loops have database connections again, after %.1f s (%s)",
                time.monotonic() - self._since,
                self._problem,
            )
            self._problem = None

    async def stop(self) -> None:
        """Hand every kept connection back to the pool (reset); idempotent."""
        await super().stop()
        idle, self._idle = self._idle, []
        for conn in idle:
            await self._give_back(conn)

    close = stop

    async def _give_back(self, conn: asyncpg.Connection) -> None:
        """To the pool, which resets it or drops it; one the server closed, the pool took
        back already when the driver noticed."""
        with contextlib.suppress(asyncpg.InterfaceError):
            await self._pool.release(conn)


def _open(conn: asyncpg.Connection) -> bool:
    try:
        return not conn.is_closed()
    except asyncpg.InterfaceError:  # closed, and released to the pool by the driver already
        return False


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
