"""The Python side of the SQL door: enqueue a job inside the caller's own transaction.

`enqueue` is a thin wrapper around `SELECT dispatcher.enqueue(...)`. It runs on a connection the
caller owns, so the job commits or rolls back together with the caller's business change (the
transactional outbox). It opens no transaction of its own and translates no errors: the database
raises SQLSTATE 22023 (`asyncpg.InvalidParameterValueError`) for an invalid request and 23505
(`asyncpg.UniqueViolationError`) when the key already names a job with a different request.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import asyncpg

from dispatcher import rfc3339

# jsonb values travel as text and are cast by the server, so the call works whatever JSON
# codecs the caller's connection has (or has not) registered.
_ENQUEUE = """
SELECT dispatcher.enqueue(
    key => $1, handler => $2, payload => $3::text::jsonb, due_at => $4::timestamptz,
    queue => $5, tenant => $6, target => $7::text::jsonb, max_attempts => $8::integer,
    max_retry_age_s => $9::integer)
"""


async def enqueue(
    conn: asyncpg.Connection,
    key: str,
    handler: str,
    payload: dict[str, Any] | None = None,
    *,
    due_at: datetime | None = None,
    queue: str | None = None,
    tenant: str | None = None,
    target: dict[str, Any] | None = None,
    max_attempts: int | None = None,
    max_retry_age_s: int | None = None,
) -> int:
    """Enqueue one job on `conn` (inside its current transaction, if any); return the job id.

    The same key with the same request returns the existing job's id; `due_at` omitted means
    now, and one more than the daemon's `due_at_past_tolerance_s` ago is refused (22023).
    `target` is required for handler "http" and refused for the others.
    """
    if due_at is not None:
        try:
            due_at = rfc3339.utc(due_at)
        except rfc3339.TimeError as exc:
            raise ValueError(f"due_at needs a timezone (e.g. datetime.now(UTC)): {exc}") from None
    job_id: int = await conn.fetchval(
        _ENQUEUE,
        key,
        handler,
        json.dumps({} if payload is None else payload),
        due_at,
        queue,
        tenant,
        None if target is None else json.dumps(target),
        max_attempts,
        max_retry_age_s,
    )
    return job_id
