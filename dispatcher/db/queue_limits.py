"""The queue settings repository (the statements of queue_limits.sql): what the configuration
file gives each queue, the operator's run-time overrides, and putting the settings in force
(migration 025). Every change notifies the daemons (NOTIFY 'limits')."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from dispatcher.db.pool import translate_unavailable
from dispatcher.db.queries import query


@dataclass(frozen=True, slots=True)
class QueueSettingsRow:
    """One queue's settings as stored: from the file (the daemon that started last) and the
    run-time overrides (which win), with when the overrides last changed."""

    name: str
    file: dict[str, Any]
    overrides: dict[str, Any]
    overrides_at: datetime | None

    @property
    def effective(self) -> dict[str, Any]:
        return {**self.file, **self.overrides}


def _row(record: asyncpg.Record) -> QueueSettingsRow:
    return QueueSettingsRow(
        record["name"],
        dict(record["file_settings"]),
        dict(record["overrides"]),
        record["overrides_at"],
    )


class QueueSettingsRepository:
    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool

    @translate_unavailable
    async def all(self) -> list[QueueSettingsRow]:
        return [_row(r) for r in await self.pool.fetch(query("queue_settings"))]

    @translate_unavailable
    async def record_file_settings(self, settings: Mapping[str, Mapping[str, Any]]) -> None:
        """At start: each configured queue's file settings; the overrides keep winning."""
        async with self.pool.acquire() as conn, conn.transaction():
            for name, values in settings.items():
                await conn.execute(query("record_file_settings"), name, dict(values))

    @translate_unavailable
    async def set_overrides(self, name: str, patch: Mapping[str, Any]) -> QueueSettingsRow | None:
        """Merge `patch` into queue `name`'s overrides (None removes one) and put the result in
        force, in one transaction; None: no such queue (nothing changed)."""
        async with self.pool.acquire() as conn, conn.transaction():
            record = await conn.fetchrow(query("set_queue_overrides"), name, dict(patch))
            if record is None:
                return None
            await conn.execute(query("apply_queue_settings"), name)
            return _row(record)

    @translate_unavailable
    async def reset_overrides(self, name: str) -> QueueSettingsRow | None:
        """Remove queue `name`'s overrides: its file settings hold again. None: no such queue."""
        async with self.pool.acquire() as conn, conn.transaction():
            record = await conn.fetchrow(query("reset_queue_overrides"), name)
            if record is None:
                return None
            await conn.execute(query("apply_queue_settings"), name)
            return _row(record)

    @translate_unavailable
    async def ready_mix(
        self, name: str, scanned: int, tenants: int
    ) -> tuple[list[tuple[int, int]], list[tuple[str, int]]]:
        """Queue `name`'s ready jobs per priority and its `tenants` tenants with most ready jobs,
        both among at most `scanned` ready jobs (one bounded index walk each)."""
        async with self.pool.acquire() as conn:
            mix = await conn.fetch(query("ready_priority_mix"), name, scanned)
            top = await conn.fetch(query("ready_top_tenants"), name, scanned, tenants)
        return (
            [(r["priority"], r["jobs"]) for r in mix],
            [(r["tenant"], r["jobs"]) for r in top],
        )

    @translate_unavailable
    async def keys_at_limit(self, name: str) -> list[str]:
        """The concurrency keys of queue `name` at their limit now (as the claims see them)."""
        keys: list[str] = await self.pool.fetchval(query("keys_at_limit"), name)
        return sorted(keys)
