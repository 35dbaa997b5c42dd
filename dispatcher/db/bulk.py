"""Bulk actions on jobs, the statements of bulk.sql (migration 037): read a selection in pages,
move one batch, keep the action's record. The walk itself (which pages, what counts) is the
operator's (dispatcher.operator.bulk).

A selection is either ids or a `JobFilter`; a filter's pages are read by the job list's own
statement (list_jobs, newest first), so whatever the list can filter on, a bulk action can."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from dispatcher.db.job_reads import error_scan_floor, list_args
from dispatcher.db.pool import translate_unavailable
from dispatcher.db.queries import query
from dispatcher.model import JobFilter, ListCursor

# One statement per action; reschedule and run now share theirs (run now: due now, and only
# from `scheduled`).
MOVES = {
    "retry": "bulk_retry",
    "cancel": "bulk_cancel",
    "discard": "bulk_discard",
    "reschedule": "bulk_reschedule",
    "run_now": "bulk_reschedule",
}


@dataclass(frozen=True, slots=True)
class Selection:
    """Which jobs a bulk action looks at: exactly these `ids`, or those `filters` match (an
    empty filter: every job). Either way only jobs up to the action's fence are taken."""

    ids: tuple[int, ...] | None = None
    filters: JobFilter | None = None


@dataclass(frozen=True, slots=True)
class Move:
    """One batch's change: the action, the jobs to move, and for a reschedule its due time
    (None: now) and the states it applies to."""

    action: str
    ids: list[int]
    due_at: datetime | None = None
    states: tuple[str, ...] = ()


async def _list_args(
    db: asyncpg.Pool | asyncpg.Connection, f: JobFilter | None, before_id: int, limit: int
) -> tuple[Any, ...]:
    """list_jobs's parameters, built as the job list builds them."""
    f = f or JobFilter()
    floor = await error_scan_floor(db, f)
    return list_args("list_jobs", f, ListCursor(before_id), limit, error_floor=floor)


class BulkStore:
    """The database side of bulk actions, on `pool`."""

    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool

    @translate_unavailable
    async def fence(self) -> int:
        """The highest job id now."""
        return int(await self.pool.fetchval(query("bulk_fence")))

    @translate_unavailable
    async def count(self, selection: Selection, fence: int, cap: int) -> dict[str, int]:
        """Jobs per state of `selection` up to `fence`, counting at most `cap` in all."""
        if selection.ids is not None:
            rows = await self.pool.fetch(
                query("bulk_seen_ids"), list(selection.ids), fence + 1, cap
            )
        else:
            statement = (
                f"SELECT state, count(*)::int AS n FROM ({query('list_jobs')}) page GROUP BY state"
            )
            args = await _list_args(self.pool, selection.filters, fence + 1, cap)
            return {r["state"]: r["n"] for r in await self.pool.fetch(statement, *args)}
        counts: dict[str, int] = {}
        for row in rows:
            counts[row["state"]] = counts.get(row["state"], 0) + 1
        return counts

    @translate_unavailable
    async def sample(self, selection: Selection, fence: int, n: int) -> list[dict[str, Any]]:
        """The first `n` jobs a walk of `selection` would look at (newest first)."""
        if selection.ids is not None:
            rows = await self.pool.fetch(query("bulk_seen_ids"), list(selection.ids), fence + 1, n)
            return [dict(r) for r in rows]
        args = await _list_args(self.pool, selection.filters, fence + 1, n)
        return [dict(r) for r in await self.pool.fetch(query("list_jobs"), *args)]

    @asynccontextmanager
    async def walker(self) -> AsyncIterator[Walker]:
        """A connection for the walk of one bulk action."""
        async with self.pool.acquire() as conn:
            yield Walker(conn)


class Overtaken(Exception):
    """Another request walks the same bulk action at the same time and its batch went first:
    this walker stops before it moved anything."""


class Walker:
    """The walk of one bulk action, on the connection that holds its lock."""

    def __init__(self, conn: asyncpg.Connection):
        self.conn = conn

    @translate_unavailable
    async def begin(
        self, key: str, action: str, request_hash: str, actor: str, fence: int
    ) -> dict[str, Any]:
        """The action's record, created with `fence` if it is new."""
        args = (key, action, request_hash, actor, fence)
        for _ in range(3):
            row = await self.conn.fetchrow(query("bulk_begin"), *args)
            # None: another request inserted the key after this statement's snapshot was
            # taken (its insert waited for that one's commit); the next statement sees it
            if row is not None:
                return dict(row)
        raise RuntimeError(f"bulk action {key!r}: its record could not be read")

    @translate_unavailable
    async def page(self, selection: Selection, before_id: int, limit: int) -> list[tuple[int, str]]:
        """(id, state) of the next `limit` jobs of `selection` below `before_id`."""
        if selection.ids is not None:
            args: Sequence[Any] = (list(selection.ids), before_id, limit)
            rows = await self.conn.fetch(query("bulk_seen_ids"), *args)
        else:
            args = await _list_args(self.conn, selection.filters, before_id, limit)
            rows = await self.conn.fetch(query("list_jobs"), *args)
        return [(r["id"], r["state"]) for r in rows]

    def transaction(self) -> Any:
        """One batch: its move and its progress commit together."""
        return self.conn.transaction()

    @translate_unavailable
    async def move(self, move: Move) -> list[dict[str, Any]]:
        """Move one batch: the jobs moved (id, queue, state after). Wakes every daemon (NOTIFY,
        sent at commit) when any became ready or scheduled."""
        if not move.ids:
            return []
        args: tuple[Any, ...] = (move.ids,)
        if move.action in ("reschedule", "run_now"):
            args = (move.ids, move.due_at, list(move.states))
        moved = [dict(r) for r in await self.conn.fetch(query(MOVES[move.action]), *args)]
        for state in sorted({r["state"] for r in moved} & {"ready", "scheduled"}):
            await self.conn.execute("SELECT pg_notify('dispatcher_wake', $1)", state)
        return moved

    @translate_unavailable
    async def turn(self, record_id: int, seen: int | None) -> None:
        """Begin a batch (in its transaction): Overtaken if the walk is no longer at `seen`,
        before any job is locked."""
        if await self.conn.fetchval(query("bulk_turn"), record_id, seen) is None:
            raise Overtaken

    @translate_unavailable
    async def progress(
        self, record_id: int, seen: int | None, cursor: int, counts: dict[str, Any], *, done: bool
    ) -> None:
        """The walk, which this walker left at `seen`, has looked at every job down to id
        `cursor`, with `counts` so far. Overtaken (roll the batch back) if it was not at `seen`."""
        args = (record_id, cursor, counts, done, seen)
        if await self.conn.fetchval(query("bulk_progress"), *args) is None:
            raise Overtaken


async def prune(pool: asyncpg.Pool, older_than_s: float, batch: int) -> int:
    """Forget finished bulk actions older than `older_than_s`; how many."""
    status = await pool.execute(query("prune_bulk_actions"), older_than_s, batch)
    return int(status.split()[-1])
