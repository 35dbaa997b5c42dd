"""A queue's claims on a connection its claim loop keeps.

A claim through the pool costs a second round trip before its rows reach the claim loop: the
pool resets a connection on release (`SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *;
RESET ALL`) and `pool.fetch` returns only after that. On loopback that is ~0.1 ms per claim (a
`SELECT 1` took 0.17 ms through the pool, 0.06 ms on a connection; 2 loaded cores), paid twice
per job of a steady stream of due-now jobs (the claim that finds the job and the one after it
that finds nothing). The claim loop of a queue claims one statement at a time, and the engine
pool counts one connection per claim loop, so the loop may as well keep it.

The claim stays planned per execution, as the pools plan everything (`force_custom_plan`): a
generic plan would save ~0.5 ms of planning per claim of one job, but it is built once, from
the statistics of the moment; built on a nearly empty table it walked the jobs' tables
sequentially, and a claim of 1,000 after a burst took 544 ms instead of 12 ms.

The connection is taken from the engine pool on the first claim and handed back, reset by the
pool, after any error, so a connection in an unknown state is never reused; the next claim
takes a fresh one.
"""

from __future__ import annotations

import contextlib

import asyncpg

from dispatcher.db.jobs import claimed_rows
from dispatcher.db.pool import translate_unavailable
from dispatcher.db.queries import query
from dispatcher.model import UNBOUNDED, ByteGrant, Job

_CLAIM = query("claim_ready")
_READY_LEFT = query("ready_left")


class ClaimConnection:
    """Claims of one queue, one at a time, on a connection held between claims. `close()`
    hands it back to its pool; it is idempotent, and a claim after it takes a connection
    again. A held connection that the server closes meanwhile (a restart, an idle timeout, an
    operator's pg_terminate_backend) is forgotten as soon as the driver notices, so the next
    claim takes a fresh one instead of failing."""

    def __init__(self, pool: asyncpg.Pool):
        self._pool = pool
        self._conn: asyncpg.Connection | None = None

    @translate_unavailable
    async def claim(
        self,
        queue: str,
        limit: int,
        capabilities: list[str],
        owner: str,
        lease_s: float,
        grant: ByteGrant = UNBOUNDED,
    ) -> tuple[list[Job], int, float | None]:
        """As `JobRepository.claim_limited`."""
        conn = self._conn or await self._take()
        try:
            rows = await conn.fetch(
                _CLAIM, queue, limit, capabilities, owner, lease_s, grant.bytes, grant.alone
            )
        except BaseException:
            await self.close()  # its state is unknown: the pool resets it or drops it
            raise
        return claimed_rows(rows)

    @translate_unavailable
    async def ready_left(self, queue: str, capabilities: list[str]) -> bool:
        """Whether a ready job of `queue` this worker can run is left (locked or not).

        After a claim that took fewer jobs than it asked, claiming again at once finds nothing
        unless one is: a job committed after the claim began wakes the loop with its NOTIFY, but
        one the claim could not take (its tenant's share was full, or another claim held it)
        wakes nobody. This look took 0.25 ms where the claim that finds nothing took 1.1-1.3 ms
        (round trips on 2 loaded cores; most of the claim's is planning), and a steady stream of
        due-now jobs paid that claim once per job."""
        conn = self._conn or await self._take()
        try:
            return bool(await conn.fetchval(_READY_LEFT, queue, capabilities))
        except BaseException:
            await self.close()
            raise

    async def _take(self) -> asyncpg.Connection:
        conn = await self._pool.acquire()
        conn.add_termination_listener(self._lost)
        self._conn = conn
        return conn

    def _lost(self, conn: asyncpg.Connection) -> None:
        self._conn = None  # the pool has taken the closed connection back already

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(asyncpg.InterfaceError):  # the pool took it back already
                conn.remove_termination_listener(self._lost)
            await self._pool.release(conn)
