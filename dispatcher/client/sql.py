"""The SQL door from Python: enqueue jobs inside the caller's own transaction.

`enqueue` / `enqueue_many` are thin wrappers around `SELECT dispatcher.enqueue(...)` and
`dispatcher.enqueue_many(...)`. They run on a connection (or session) the caller owns, so the
jobs commit or roll back together with the caller's business change (the transactional outbox).
They open no transaction of their own and translate no errors: the database raises SQLSTATE
22023 (invalid parameter value) for an invalid request and 23505 (unique violation) when the key
already names a job with a different request, as the caller's driver spells those.

Drivers, found from the object passed (no driver is imported until one is used):
- async (`await enqueue(...)`): an asyncpg connection or pool connection, a psycopg 3
  `AsyncConnection`, a SQLAlchemy `AsyncSession` or `AsyncConnection`;
- sync (`enqueue_sync(...)`): a psycopg 3 `Connection`, a SQLAlchemy `Session` or `Connection`.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dispatcher.core import rfc3339

# Values travel as text and are cast by the server (CAST, not `::`, which SQLAlchemy's text()
# would read as a bind marker), so the call works whatever codecs the connection registered.
_ENQUEUE = """
SELECT dispatcher.enqueue(
    key => :key, handler => :handler, payload => CAST(CAST(:payload AS text) AS jsonb),
    due_at => CAST(CAST(:due_at AS text) AS timestamptz), queue => :queue, tenant => :tenant,
    target => CAST(CAST(:target AS text) AS jsonb),
    max_attempts => CAST(CAST(:max_attempts AS text) AS integer),
    max_retry_age_s => CAST(CAST(:max_retry_age_s AS text) AS integer),
    priority => CAST(CAST(:priority AS text) AS integer), concurrency_key => :concurrency_key,
    timeout_s => CAST(CAST(:timeout_s AS text) AS float8),
    expires_at => CAST(CAST(:expires_at AS text) AS timestamptz),
    on_success => CAST(CAST(:on_success AS text) AS jsonb),
    on_failure => CAST(CAST(:on_failure AS text) AS jsonb),
    on_key => :on_key, debounce_max_s => CAST(CAST(:debounce_max_s AS text) AS integer))
"""

_ENQUEUE_MANY = """
SELECT r.id, r.key, r.state, r.outcome FROM dispatcher.enqueue_many(
    keys => CAST(:keys AS text[]), handlers => CAST(:handlers AS text[]),
    payloads => CAST(CAST(:payloads AS text[]) AS jsonb[]),
    due_ats => CAST(CAST(:due_ats AS text[]) AS timestamptz[]),
    queues => CAST(:queues AS text[]), tenants => CAST(:tenants AS text[]),
    targets => CAST(CAST(:targets AS text[]) AS jsonb[]),
    max_attempts => CAST(CAST(:max_attempts AS text[]) AS integer[]),
    max_retry_age_s => CAST(CAST(:max_retry_age_s AS text[]) AS integer[]),
    priorities => CAST(CAST(:priority AS text[]) AS integer[]),
    concurrency_keys => CAST(:concurrency_key AS text[]),
    timeout_s => CAST(CAST(:timeout_s AS text[]) AS float8[]),
    expires_ats => CAST(CAST(:expires_at AS text[]) AS timestamptz[]),
    on_success => CAST(CAST(:on_success AS text[]) AS jsonb[]),
    on_failure => CAST(CAST(:on_failure AS text[]) AS jsonb[]),
    on_keys => CAST(:on_key AS text[]),
    debounce_max_s => CAST(CAST(:debounce_max_s AS text[]) AS integer[])) r
ORDER BY r.ord
"""

_PARAM = re.compile(r"(?<![:\w]):(\w+)")


@dataclass(frozen=True, slots=True)
class SqlJob:
    """One job for `enqueue_many`: the arguments of `enqueue`. `due_at` None means now;
    `priority` -100..100, lower runs first (None: 0); `concurrency_key` None means the tenant,
    "" no key. The contract (docs/guides/intake-contracts.md), each None when not asked:
    `timeout_s`, the job's deadline per attempt (not for "http": its target has one);
    `expires_at`, after which no attempt starts (the job ends dead, `expired`); `on_success` /
    `on_failure`, a target (`{"url": ...}`) pushed when the job succeeds / dies; `on_key`,
    what to do when the key names a job with another request: "reject" (the default: a
    conflict), "replace" (debounce: the new request and due time replace a scheduled job's,
    the due time never later than its acceptance plus `debounce_max_s`) or "keep_due"
    (throttle: the first due time stays)."""

    key: str
    handler: str
    payload: dict[str, Any] | None = None
    due_at: datetime | None = None
    queue: str | None = None
    tenant: str | None = None
    target: dict[str, Any] | None = None
    max_attempts: int | None = None
    max_retry_age_s: int | None = None
    priority: int | None = None
    concurrency_key: str | None = None
    timeout_s: float | None = None
    expires_at: datetime | None = None
    on_success: dict[str, Any] | None = None
    on_failure: dict[str, Any] | None = None
    on_key: str | None = None
    debounce_max_s: int | None = None


@dataclass(frozen=True, slots=True)
class Enqueued:
    """What `enqueue_many` did with one item, in the items' order. `outcome` is "created",
    "existing" (the same key and request: the same job), "pruned" (the same key and request
    as a job that finished and was pruned: its id and final state, nothing enqueued) or
    "conflict" (the key names a job with another request, or a contract; nothing was enqueued
    for this item), and for an item with `on_key` "replace" or "keep_due": "replaced" (the
    scheduled job now carries this request) or "not_replaced" (the job is already `state`,
    ready, running or finished: unchanged)."""

    id: int
    key: str
    state: str
    outcome: str


async def enqueue(
    conn: Any,
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
    priority: int | None = None,
    concurrency_key: str | None = None,
    timeout_s: float | None = None,
    expires_at: datetime | None = None,
    on_success: dict[str, Any] | None = None,
    on_failure: dict[str, Any] | None = None,
    on_key: str | None = None,
    debounce_max_s: int | None = None,
) -> int:
    """Enqueue one job on `conn` (inside its current transaction, if any); return the job id.

    The same key with the same request returns the existing job's id; `due_at` omitted means
    now, and one more than the daemon's `due_at_past_tolerance_s` ago is refused (22023).
    `target` is required for handler "http" and refused for the others. `priority`,
    `concurrency_key` and the contract (`timeout_s`, `expires_at`, `on_success`, `on_failure`,
    `on_key`, `debounce_max_s`) as in `SqlJob`. With `on_key` "replace" or "keep_due", a key
    naming a scheduled job with another request replaces it and returns its id; a job already
    ready, running or finished is never replaced (23505, naming its state).
    """
    job = SqlJob(
        key,
        handler,
        payload,
        due_at=due_at,
        queue=queue,
        tenant=tenant,
        target=target,
        max_attempts=max_attempts,
        max_retry_age_s=max_retry_age_s,
        priority=priority,
        concurrency_key=concurrency_key,
        timeout_s=timeout_s,
        expires_at=expires_at,
        on_success=on_success,
        on_failure=on_failure,
        on_key=on_key,
        debounce_max_s=debounce_max_s,
    )
    row = await _fetch_async(conn, _ENQUEUE, _one(job))
    return int(row[0][0])


async def enqueue_many(conn: Any, jobs: Sequence[SqlJob]) -> list[Enqueued]:
    """Enqueue `jobs` in one statement on `conn`; one `Enqueued` per item, in order. An invalid
    item raises (22023) and enqueues none of them: the statement is one unit."""
    rows = await _fetch_async(conn, _ENQUEUE_MANY, _many(jobs))
    return [Enqueued(int(r[0]), r[1], r[2], r[3]) for r in rows]


def enqueue_sync(
    conn: Any,
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
    priority: int | None = None,
    concurrency_key: str | None = None,
    timeout_s: float | None = None,
    expires_at: datetime | None = None,
    on_success: dict[str, Any] | None = None,
    on_failure: dict[str, Any] | None = None,
    on_key: str | None = None,
    debounce_max_s: int | None = None,
) -> int:
    """`enqueue` for a psycopg 3 `Connection` or a SQLAlchemy `Session` / `Connection`."""
    job = SqlJob(
        key,
        handler,
        payload,
        due_at=due_at,
        queue=queue,
        tenant=tenant,
        target=target,
        max_attempts=max_attempts,
        max_retry_age_s=max_retry_age_s,
        priority=priority,
        concurrency_key=concurrency_key,
        timeout_s=timeout_s,
        expires_at=expires_at,
        on_success=on_success,
        on_failure=on_failure,
        on_key=on_key,
        debounce_max_s=debounce_max_s,
    )
    return int(_fetch_sync(conn, _ENQUEUE, _one(job))[0][0])


def enqueue_many_sync(conn: Any, jobs: Sequence[SqlJob]) -> list[Enqueued]:
    """`enqueue_many` for a psycopg 3 `Connection` or a SQLAlchemy `Session` / `Connection`."""
    rows = _fetch_sync(conn, _ENQUEUE_MANY, _many(jobs))
    return [Enqueued(int(r[0]), r[1], r[2], r[3]) for r in rows]


# parameters ------------------------------------------------------------------------------------
def _time(name: str, value: datetime | None) -> str | None:
    if value is None:
        return None
    try:
        return rfc3339.format(value)
    except rfc3339.TimeError as exc:
        raise ValueError(f"{name} needs a timezone (e.g. datetime.now(UTC)): {exc}") from None


def _json(value: dict[str, Any] | None) -> str | None:
    return None if value is None else json.dumps(value)


def _text(value: int | None) -> str | None:
    return None if value is None else str(value)


def _one(job: SqlJob) -> dict[str, Any]:
    return {
        "key": job.key,
        "handler": job.handler,
        "payload": json.dumps({} if job.payload is None else job.payload),
        "due_at": _time("due_at", job.due_at),
        "queue": job.queue,
        "tenant": job.tenant,
        "target": _json(job.target),
        "max_attempts": _text(job.max_attempts),
        "max_retry_age_s": _text(job.max_retry_age_s),
        "priority": _text(job.priority),
        "concurrency_key": job.concurrency_key,
        "timeout_s": None if job.timeout_s is None else repr(float(job.timeout_s)),
        "expires_at": _time("expires_at", job.expires_at),
        "on_success": _json(job.on_success),
        "on_failure": _json(job.on_failure),
        "on_key": job.on_key,
        "debounce_max_s": _text(job.debounce_max_s),
    }


def _many(jobs: Sequence[SqlJob]) -> dict[str, list[str | None] | None]:
    """Column arrays; a column no item sets is NULL (the function's default for every item)."""
    rows = [_one(job) for job in jobs]
    columns: dict[str, list[str | None] | None] = {}
    for name, plural in (
        ("key", "keys"),
        ("handler", "handlers"),
        ("payload", "payloads"),
        ("due_at", "due_ats"),
        ("queue", "queues"),
        ("tenant", "tenants"),
        ("target", "targets"),
        ("max_attempts", "max_attempts"),
        ("max_retry_age_s", "max_retry_age_s"),
        ("priority", "priority"),
        ("concurrency_key", "concurrency_key"),
        ("timeout_s", "timeout_s"),
        ("expires_at", "expires_at"),
        ("on_success", "on_success"),
        ("on_failure", "on_failure"),
        ("on_key", "on_key"),
        ("debounce_max_s", "debounce_max_s"),
    ):
        values = [row[name] for row in rows]
        columns[plural] = values if any(v is not None for v in values) else None
    return columns


# drivers ---------------------------------------------------------------------------------------
def _driver(conn: Any) -> str:
    """ "asyncpg", "psycopg" or "sqlalchemy", from the type of the caller's object."""
    for cls in type(conn).__mro__:
        top = cls.__module__.partition(".")[0]
        if top in ("asyncpg", "psycopg", "sqlalchemy"):
            return top
    raise TypeError(
        f"cannot enqueue on a {type(conn).__name__}: pass an asyncpg connection, a psycopg 3 "
        "connection, or a SQLAlchemy session or connection (sync ones to enqueue_sync)"
    )


def _positional(sql: str, params: dict[str, Any]) -> tuple[str, list[Any]]:
    """`:name` markers as asyncpg's `$n`, with the values in that order."""
    order: list[str] = []

    def number(match: re.Match[str]) -> str:
        order.append(match.group(1))
        return f"${len(order)}"

    return _PARAM.sub(number, sql), [params[name] for name in order]


def _pyformat(sql: str) -> str:
    """`:name` markers as psycopg's `%(name)s`."""
    return _PARAM.sub(r"%(\1)s", sql)


def _is_async(conn: Any) -> bool:
    return inspect.iscoroutinefunction(getattr(conn, "execute", None))


async def _fetch_async(conn: Any, sql: str, params: dict[str, Any]) -> list[Any]:
    driver = _driver(conn)
    if driver != "asyncpg" and not _is_async(conn):
        raise TypeError(f"a {type(conn).__name__} is synchronous: use enqueue_sync(...)")
    if driver == "asyncpg":
        text, args = _positional(sql, params)
        return list(await conn.fetch(text, *args))
    if driver == "psycopg":
        cursor = await conn.execute(_pyformat(sql), params)
        return list(await cursor.fetchall())
    from sqlalchemy import text as sa_text

    result = await conn.execute(sa_text(sql), params)
    return list(result.all())


def _fetch_sync(conn: Any, sql: str, params: dict[str, Any]) -> list[Any]:
    driver = _driver(conn)
    if driver == "asyncpg" or _is_async(conn):
        raise TypeError(f"a {type(conn).__name__} is asynchronous: use `await enqueue(...)`")
    if driver == "psycopg":
        return list(conn.execute(_pyformat(sql), params).fetchall())
    from sqlalchemy import text as sa_text

    return list(conn.execute(sa_text(sql), params).all())
