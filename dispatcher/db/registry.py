"""The registry of queues, limit groups and handlers, kept in step with the configuration at
start: the SQL door's defaults, each queue's global limits (migration 013), its limit group and
its per-key limits (migration 024), the handlers' versions."""

from __future__ import annotations

from typing import Any

import asyncpg

from dispatcher.db.queries import query

# rate_per_s, burst, max_inflight of a queue, a limit group or a key (None: no such limit)
Limits = tuple[float | None, int | None, int | None]


async def sync_registry(
    pool: asyncpg.Pool,
    queues: dict[str, tuple[int, int]],
    handlers: dict[str, tuple[str, int]],
    on_dead: dict[str, tuple[dict[str, Any] | None, str | None]] | None = None,
    limits: dict[str, Limits] | None = None,
    *,
    due_at_past_tolerance_s: float | None = None,
    ready_outbox: bool = False,
    groups: dict[str, Limits] | None = None,
    membership: dict[str, tuple[str | None, int]] | None = None,
    key_limits: dict[str, Limits] | None = None,
    max_payload_bytes: int = 256 * 1024,
    max_timeout_s: dict[str, float] | None = None,
) -> None:
    """Write the configured queues and handlers to the registry; `on_dead` gives each
    queue's dead-letter notification (normalized target, notification queue), `limits` its
    global limits (rate_per_s, burst, max_inflight; a queue left out has none);
    `due_at_past_tolerance_s`, how far past a due time the SQL door still accepts;
    `ready_outbox`, whether ready jobs get outbox rows (a relay transport: migration 015);
    `groups`, the limit groups (rate_per_s, burst, max_inflight) and `membership`, each
    queue's group and priority in it (a queue left out is in none), `key_limits` the limits
    every concurrency key of a queue gets (a queue left out: none; migration 024);
    `max_payload_bytes`, the largest job the SQL door accepts (migration 029);
    `max_timeout_s`, the longest deadline a job of each handler may ask for (migration 030;
    a handler left out keeps what it had)."""
    async with pool.acquire() as conn, conn.transaction():
        for name in groups or {}:
            await conn.execute(query("ensure_limit_group"), name)
        if due_at_past_tolerance_s is not None:
            await conn.execute(
                query("sync_intake_settings"),
                due_at_past_tolerance_s,
                ready_outbox,
                max_payload_bytes,
            )
        for name, (max_attempts, max_retry_age_s) in queues.items():
            rate, burst, inflight = (limits or {}).get(name, (None, None, None))
            await conn.execute(
                query("upsert_queue"),
                name,
                max_attempts,
                max_retry_age_s,
                rate,
                burst if rate is not None else None,
                inflight,
            )
            group, priority = (membership or {}).get(name, (None, 0))
            await conn.execute(query("set_queue_group"), name, group, priority)
            key_rate, key_burst, key_inflight = (key_limits or {}).get(name, (None, None, None))
            await conn.execute(
                query("set_queue_key_limits"), name, key_rate, key_burst, key_inflight
            )
        for name, (rate, burst, inflight) in (groups or {}).items():
            await conn.execute(
                query("upsert_limit_group"),
                name,
                rate,
                burst if rate is not None else None,
                inflight,
            )
        await conn.execute(query("drop_unconfigured_limit_groups"), list(groups or {}))
        for name, (target, notice_queue) in (on_dead or {}).items():
            await conn.execute(query("sync_queue_on_dead"), name, target, notice_queue)
        for name, (kind, version) in handlers.items():
            limit_s = (max_timeout_s or {}).get(name)
            await conn.execute(query("upsert_handler"), name, kind, version, limit_s)
