"""The cluster-wide history (migration 038), the statements of history.sql: add one daemon's
counts to the current minute, read a queue's minutes summed into steps, the overview's recent
starts, and retention.

`ALL_QUEUES` names the row of every queue together: each flush writes it beside the queues'
rows, so the overview reads one row per minute however many queues there are."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from dispatcher.db.pool import translate_unavailable
from dispatcher.db.queries import query

ALL_QUEUES = "*"


@dataclass(frozen=True, slots=True)
class Counts:
    """What one queue did in one flush interval (or, read back, in one step): attempts started,
    jobs succeeded, attempts retried, jobs dead, started attempts per due-to-start latency
    bucket, and the oldest ready job's age (None: not known, or nothing ready)."""

    started: int = 0
    succeeded: int = 0
    retried: int = 0
    dead: int = 0
    latency: tuple[int, ...] = ()
    oldest_ready_s: float | None = None

    def is_empty(self) -> bool:
        return not (self.started or self.succeeded or self.retried or self.dead) and (
            self.oldest_ready_s is None
        )

    def to_row(self, queue: str) -> dict[str, Any]:
        return {
            "queue": queue,
            "started": self.started,
            "succeeded": self.succeeded,
            "retried": self.retried,
            "dead": self.dead,
            "latency": list(self.latency),
            "oldest_ready_s": self.oldest_ready_s,
        }


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a history read: its start and the counts summed over its minutes."""

    at: datetime
    counts: Counts


class HistoryStore:
    """The history table, on `pool`."""

    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool

    @translate_unavailable
    async def add(self, counts: dict[str, Counts], at: datetime | None = None) -> None:
        """Add `counts` (per queue; `ALL_QUEUES` among them if wanted) to the minute of `at`
        (None: the database's now), in one statement."""
        rows = [c.to_row(queue) for queue, c in sorted(counts.items()) if not c.is_empty()]
        if rows:
            await self.pool.execute(query("history_add"), rows, at)

    @translate_unavailable
    async def read(self, queue: str, since: datetime, until: datetime, step_s: int) -> list[Step]:
        """`queue`'s minutes in [since, until), summed per `step_s` from `since` (steps with
        no row are left out)."""
        rows = await self.pool.fetch(query("history_read"), queue, since, until, step_s)
        return [
            Step(
                r["at"],
                Counts(
                    r["started"],
                    r["succeeded"],
                    r["retried"],
                    r["dead"],
                    tuple(r["latency"] or ()),
                    r["oldest_ready_s"],
                ),
            )
            for r in rows
        ]

    @translate_unavailable
    async def recent_starts_per_s(self) -> dict[str, float]:
        """Every daemon's starts per second of each queue over the current and the previous
        minute (a queue that started nothing lately is absent)."""
        rows = await self.pool.fetch(query("history_recent_starts"))
        return {r["queue"]: r["started"] / r["seconds"] for r in rows}

    async def prune(self, keep_s: int, batch: int) -> int:
        """Delete up to `batch` rows of minutes older than `keep_s`; how many went."""
        status = await self.pool.execute(query("prune_history"), keep_s, batch)
        return int(status.split()[-1])
