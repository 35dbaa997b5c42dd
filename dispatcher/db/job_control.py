"""The jobs repository's operator control: retry, cancel, discard and redrive dead letters,
reschedule a waiting job, pause and resume a queue. A change that makes jobs ready wakes the
workers of every daemon (NOTIFY, sent at commit)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg

from dispatcher.db.pool import translate_unavailable
from dispatcher.db.queries import query
from dispatcher.model import DeadLetterFilter

# Only waiting jobs can be rescheduled; a look that raced a claim or the scan is retried.
RESCHEDULABLE = ("scheduled", "ready")
RESCHEDULE_ROUNDS = 5


class _MovedMeanwhile(Exception):
    """The job left the state a reschedule saw before its move (internal: roll back, retry)."""


class JobControl:
    """What an operator does to jobs and queues (HTTP, CLI, console)."""

    pool: asyncpg.Pool

    @translate_unavailable
    async def retry(self, job_id: int) -> dict[str, Any] | None:
        row = await self.pool.fetchrow(query("retry_job"), job_id)
        if row:
            await self.pool.execute("SELECT pg_notify('dispatcher_wake', 'ready')")
        return dict(row) if row else None

    @translate_unavailable
    async def cancel(self, job_id: int) -> dict[str, Any] | None:
        row = await self.pool.fetchrow(query("cancel_job"), job_id)
        return dict(row) if row else None

    @translate_unavailable
    async def discard(self, job_id: int) -> dict[str, Any] | None:
        """Discard a dead job; None when the job is not dead (or does not exist)."""
        row = await self.pool.fetchrow(query("discard_job"), job_id)
        return dict(row) if row else None

    @translate_unavailable
    async def move_dead(
        self, to_state: str, found: DeadLetterFilter, limit: int, fence: datetime
    ) -> int:
        """One batch of a bulk redrive (`to_state` "ready") or discard ("discarded"): up to
        `limit` dead jobs that match and died at or before `fence`; returns how many moved."""
        f = found
        args = (limit, f.queue, f.dead_reason, f.tenant, f.dead_since, f.dead_before, fence)
        moved: int = await self.pool.fetchval(query("move_dead"), *args, to_state)
        if moved and to_state == "ready":
            await self.pool.execute("SELECT pg_notify('dispatcher_wake', 'ready')")
        return moved

    @translate_unavailable
    async def count_dead(self, found: DeadLetterFilter, limit: int | None, fence: datetime) -> int:
        """How many dead jobs `move_dead` would take (at most `limit`); changes nothing."""
        f = found
        args = (limit, f.queue, f.dead_reason, f.tenant, f.dead_since, f.dead_before, fence)
        return int(await self.pool.fetchval(query("count_dead"), *args))

    @translate_unavailable
    async def reschedule(
        self, job_id: int, due_at: datetime | None, movable: tuple[str, ...] = RESCHEDULABLE
    ) -> dict[str, Any] | str | None:
        """Move a job in one of the `movable` states (scheduled or ready) to `due_at` (None:
        now). Returns the job after the move, or the state that forbids it, or None for an
        unknown job. A job a worker claims (or the scan moves) between the look and the move is
        looked at again."""
        for _ in range(RESCHEDULE_ROUNDS):
            try:
                async with self.pool.acquire() as conn, conn.transaction():
                    return await self._reschedule_in(conn, job_id, due_at, movable)
            except _MovedMeanwhile:
                continue
        current = await self.pool.fetchrow(query("job_placement"), job_id)
        return None if current is None else str(current["state"])

    async def _reschedule_in(
        self,
        conn: asyncpg.Connection,
        job_id: int,
        due_at: datetime | None,
        movable: tuple[str, ...],
    ) -> dict[str, Any] | str | None:
        seen = await conn.fetchrow(query("job_placement"), job_id)
        if seen is None:
            return None
        state = str(seen["state"])
        if state not in movable:
            return state
        if state == "ready":
            await conn.execute(
                query("withdraw_outbox_row"),
                job_id,
                seen["queue"],
                seen["tenant"],
                due_at,
                seen["priority"],
            )
        row = await conn.fetchrow(query("reschedule_job"), job_id, due_at, state)
        if row is None:
            raise _MovedMeanwhile  # roll back the withdrawal and look again
        await conn.execute("SELECT pg_notify('dispatcher_wake', $1)", row["state"])
        return dict(row)

    @translate_unavailable
    async def set_queue_paused(self, name: str, paused: bool) -> dict[str, Any] | None:
        """Pause or resume a queue (None: no such queue). A resume wakes the workers of every
        daemon on the database (NOTIFY, sent at commit)."""
        async with self.pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(query("set_queue_paused"), name, paused)
            if row is not None and not paused:
                await conn.execute("SELECT pg_notify('dispatcher_wake', 'ready')")
        return dict(row) if row else None
