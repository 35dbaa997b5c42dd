"""Per-key limit overrides, the statements of key_limits.sql (migration 024): persisted, read by
every daemon's next claim of the queue (the claim reads dispatcher.key_limits itself)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg

from dispatcher.db.pool import translate_unavailable
from dispatcher.db.queries import query


@dataclass(frozen=True, slots=True)
class KeyOverride:
    """One key's own limits; None: the queue's key_* setting applies to that one."""

    queue: str
    key: str
    max_inflight: int | None
    rate_per_s: float | None
    burst: int | None
    updated_at: datetime


class KeyLimitsRepository:
    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool

    @translate_unavailable
    async def set_override(
        self,
        queue: str,
        key: str,
        max_inflight: int | None,
        rate_per_s: float | None,
        burst: int | None,
    ) -> KeyOverride | None:
        """Store key `key`'s limits; None when queue `queue` does not exist."""
        row = await self.pool.fetchrow(
            query("set_key_limits"), queue, key, max_inflight, rate_per_s, burst
        )
        return None if row is None else KeyOverride(**dict(row))

    @translate_unavailable
    async def clear_override(self, queue: str, key: str) -> bool:
        """Back to the queue's limits; whether the key had an override."""
        return bool(await self.pool.fetchval(query("clear_key_limits"), queue, key))

    @translate_unavailable
    async def overrides(self, queue: str) -> list[KeyOverride]:
        rows = await self.pool.fetch(query("key_overrides"), queue)
        return [KeyOverride(**dict(row)) for row in rows]
