"""Jobs straight in and out of the test database, bypassing the API."""

from __future__ import annotations

from typing import Any

import asyncpg

from dispatcher.api.filters import page_cursor, parse_cursor, parse_job_filter
from dispatcher.db.jobs import JobRepository
from dispatcher.model import ListCursor


async def enqueue_noop_jobs(
    pool: asyncpg.Pool, prefix: str, count: int, due: str | None = None, tenants: int = 0
) -> None:
    """Enqueue `count` 'noop' jobs keyed `<prefix>-<n>` in one enqueue_many, due at SQL `due`,
    spread over `tenants` tenants ('t0', 't1', ...) when given."""
    due_times = "" if due is None else f", array_fill({due}, ARRAY[{count}])"
    tenant_names = (
        f", tenants => (SELECT array_agg('t' || g % {tenants}) FROM generate_series(1, {count}) g)"
        if tenants
        else ""
    )
    await pool.execute(f"""
        SELECT count(*) FROM dispatcher.enqueue_many(
               (SELECT array_agg('{prefix}-' || g) FROM generate_series(1, {count}) g),
               array_fill('noop'::text, ARRAY[{count}]),
               array_fill('{{}}'::jsonb, ARRAY[{count}]){due_times}{tenant_names})""")


async def stored_job(pool: Any, job_id: int | None = None, *, key: str | None = None) -> Any:
    """The whole stored job (payload and target included, which the repository's status reads
    leave out), by id or by key; None when there is none."""
    if key is not None:
        return await pool.fetchrow("SELECT * FROM dispatcher.jobs WHERE key = $1", key)
    return await pool.fetchrow("SELECT * FROM dispatcher.jobs WHERE id = $1", job_id)


async def listed_keys(repo: JobRepository, limit: int = 100, **values: str) -> list[str]:
    """The keys the job list shows for these filters (API spelling), every page, in order,
    following each page's cursor as a client does (a bounded search's too)."""
    filters = parse_job_filter(values)
    found: list[str] = []
    cursor: ListCursor | None = None
    while True:
        page = await repo.list_summaries(filters, cursor=cursor, limit=limit)
        found += [r["key"] for r in page.rows]
        after = page_cursor(page, filters, limit)
        if after is None:
            return found
        cursor = parse_cursor(after, filters)
