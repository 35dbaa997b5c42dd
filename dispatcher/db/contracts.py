"""Per-job contracts at intake (migration 030): a job's own deadline, time to live and callback
targets, written in the transaction that creates the job, and compared when a request is
replayed (the same key with another contract is another request: a conflict)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg

from dispatcher.core import jsoncodec
from dispatcher.db.queries import query
from dispatcher.model import EnqueueResult, NewJob


async def store(conn: asyncpg.Connection, created: list[tuple[int, NewJob]]) -> None:
    """Inside the creating transaction: the contracts of the jobs just created (id, item)."""
    if not created:
        return
    await conn.execute(
        query("set_contracts"),
        [job_id for job_id, _ in created],
        *columns([item for _, item in created]),
    )


def columns(items: Sequence[NewJob]) -> tuple[list[Any], ...]:
    """The contract as statement arguments, one array per field: timeout_s, expires_at, and
    on_success and on_failure as JSON text."""
    return (
        [item.timeout_s for item in items],
        [item.expires_at for item in items],
        [_json(item.on_success) for item in items],
        [_json(item.on_failure) for item in items],
    )


async def replayed(
    db: asyncpg.Pool | asyncpg.Connection,
    items: Sequence[NewJob],
    results: list[EnqueueResult],
) -> list[EnqueueResult]:
    """A replay that found its job is `existing` only if it asked for the same contract;
    otherwise it becomes a `conflict`. Read only when a request was replayed."""
    found = [r.id for r in results if r.outcome == "existing"]
    stored = {r["id"]: r for r in await db.fetch(query("job_contracts"), found)}
    checked = []
    for item, result in zip(items, results, strict=True):
        row = stored.get(result.id) if result.outcome == "existing" else None
        asked = (item.timeout_s, item.expires_at, item.on_success, item.on_failure)
        if row is not None and tuple(row[1:]) != asked:
            result = EnqueueResult(
                result.id, result.key, result.state, result.due_at, result.created_at, "conflict"
            )
        checked.append(result)
    return checked


def _json(value: dict[str, Any] | None) -> str | None:
    return None if value is None else jsoncodec.dumps(value)
