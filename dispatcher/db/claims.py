"""A queue's claims on a connection its claim loop keeps, with the claim planned once.

The pools plan every statement afresh (`plan_cache_mode = force_custom_plan`, for the batch
statements whose arrays a generic plan misjudges). The claim statement takes no array whose
size matters to its plan: the batch size only reaches `claim_grant`, and the queue and the
capability list are compared through the same partial index whatever their values. Planning
it anew was most of its cost at the batch sizes a steady stream of due-now jobs gives: on 2
shared cores (PostgreSQL 15, EXPLAIN ANALYZE of a claim of one job) 0.5-0.6 ms of planning
and 0.4-0.5 ms of execution, against 0.27 ms executed from a generic plan (and a claim of
1,000 jobs was not slower from it). A kept connection also spares each claim the pool's reset
round trip on release (`RESET ALL` and friends, ~0.1 ms on loopback).

The connection is taken from the engine pool on the first claim (the pool counts one claim loop
per queue) and handed back, reset by the pool, after any error, so a broken connection is
never reused; the next claim takes a fresh one.
"""

from __future__ import annotations

import contextlib

import asyncpg

from dispatcher.db.jobs import claimed_rows
from dispatcher.db.pool import translate_unavailable
from dispatcher.db.queries import query
from dispatcher.model import Job

_CLAIM = query("claim_ready")


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
        self, queue: str, limit: int, capabilities: list[str], owner: str, lease_s: float
    ) -> tuple[list[Job], int, float | None]:
        """As `JobRepository.claim_limited`."""
        conn = self._conn or await self._take()
        try:
            rows = await conn.fetch(_CLAIM, queue, limit, capabilities, owner, lease_s)
        except BaseException:
            await self.close()  # its state is unknown: the pool resets it or drops it
            raise
        return claimed_rows(rows)

    async def _take(self) -> asyncpg.Connection:
        conn = await self._pool.acquire()
        try:
            await conn.execute("SET plan_cache_mode = force_generic_plan")
        except BaseException:
            await self._pool.release(conn)
            raise
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
            await self._pool.release(conn)  # RESET ALL: the pool's plan mode again
