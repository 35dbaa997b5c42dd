"""The job list's dead-reason filter (`reason`) on real PostgreSQL: exactly the jobs with that
reason (dead, and discarded ones, which keep it), newest first, page by page; other filters
combine with it; a retried job leaves the list."""

from __future__ import annotations

import asyncpg

from dispatcher.db.jobs import JobRepository
from tests.harness.jobs import listed_keys as keys

GONE = "HTTP 410 Gone"


async def seed(pool: asyncpg.Pool) -> None:
    """60 jobs: every 3rd dead (GONE on even ids, 'max_attempts' on odd), in two queues."""
    await pool.execute(
        """
        INSERT INTO dispatcher.jobs (key, request_hash, queue, handler, payload, state, due_at,
               max_attempts, max_retry_age_s, budget_started_at, finished_at, dead_reason)
        SELECT 'r-' || g, md5(g::text), CASE WHEN g % 2 = 0 THEN 'default' ELSE 'other' END,
               'noop', '{}'::jsonb, CASE WHEN g % 3 = 0 THEN 'dead' ELSE 'succeeded' END,
               now(), 10, 86400, now(), now(),
               CASE WHEN g % 3 <> 0 THEN NULL WHEN g % 2 = 0 THEN $1 ELSE 'max_attempts' END
          FROM generate_series(1, 60) g""",
        GONE,
    )


async def test_reason_lists_exactly_its_jobs_newest_first_page_by_page(
    pool: asyncpg.Pool, repo: JobRepository
) -> None:
    await seed(pool)
    gone = [f"r-{g}" for g in range(60, 0, -1) if g % 6 == 0]
    assert await keys(repo, reason=GONE) == gone
    assert await keys(repo, limit=3, reason=GONE) == gone
    assert await keys(repo, reason=GONE, queue="other") == []
    assert len(await keys(repo, reason="max_attempts", state="dead")) == 10
    assert await keys(repo, reason="no such reason") == []


async def test_a_discarded_job_keeps_its_reason_and_a_retried_one_leaves(
    pool: asyncpg.Pool, repo: JobRepository
) -> None:
    await seed(pool)
    ids = {r["key"]: r["id"] for r in await pool.fetch("SELECT id, key FROM dispatcher.jobs")}
    assert await repo.discard(ids["r-60"]) is not None
    assert await repo.retry(ids["r-54"]) is not None
    listed = await keys(repo, reason=GONE)
    assert listed[:2] == ["r-60", "r-48"] and "r-54" not in listed
    assert await keys(repo, reason=GONE, state="discarded") == ["r-60"]
