"""The job list's searches on real PostgreSQL (migration 039): a key prefix and last-error text
match literally (a % or _ typed matches itself, not any text), the error search ignores case,
a concurrency key matches exactly, each combines with the other filters and pages by cursor,
and a bulk action's selection by the same filter counts the same jobs."""

from __future__ import annotations

import asyncpg

from dispatcher.api.filters import parse_job_filter
from dispatcher.db.bulk import BulkStore, Selection
from dispatcher.db.jobs import JobRepository
from tests.harness.jobs import listed_keys as keys

KEYS = ["inv-1", "inv-10", "inv-2", "inv_1", "inv%1", "inva", "INV-3", "other-inv-1"]
ERRORS = {
    "inv-1": "HTTP 503 from Billing",
    "inv-10": "connect timeout: billing.example",
    "inv_1": "50% of quota_used",
    "inv%1": "5000 of quota used",
}


async def seed(pool: asyncpg.Pool) -> None:
    for n, key in enumerate(KEYS):
        await pool.execute(
            """
            INSERT INTO dispatcher.jobs (key, request_hash, queue, handler, payload, state,
                   due_at, max_attempts, max_retry_age_s, budget_started_at, last_error,
                   concurrency_key)
            VALUES ($1::text, md5($1), 'default', 'noop', '{}', $2, now(), 10, 86400, now(),
                    $3, $4)""",
            key,
            "dead" if key in ERRORS else "succeeded",
            ERRORS.get(key),
            "acme" if n % 2 == 0 else "Acme",
        )


async def test_a_key_prefix_matches_literally_newest_first(
    pool: asyncpg.Pool, repo: JobRepository
) -> None:
    await seed(pool)
    assert await keys(repo, key_prefix="inv-1") == ["inv-10", "inv-1"]
    assert await keys(repo, key_prefix="inv-1", limit=1) == ["inv-10", "inv-1"]
    assert await keys(repo, key_prefix="inv_") == ["inv_1"]  # _ is no wildcard
    assert await keys(repo, key_prefix="inv%") == ["inv%1"]  # nor is %
    assert await keys(repo, key_prefix="inv") == [
        "inva",
        "inv%1",
        "inv_1",
        "inv-2",
        "inv-10",
        "inv-1",
    ]  # case counts in keys
    assert await keys(repo, key_prefix="inv-", state="dead") == ["inv-10", "inv-1"]


async def test_error_text_matches_anywhere_in_any_case_and_literally(
    pool: asyncpg.Pool, repo: JobRepository
) -> None:
    await seed(pool)
    assert await keys(repo, error="billing") == ["inv-10", "inv-1"]
    assert await keys(repo, error="BILLING", key_prefix="inv-10") == ["inv-10"]
    assert await keys(repo, error="0% of") == ["inv_1"]  # not "5000 of"
    assert await keys(repo, error="quota_used") == ["inv_1"]  # not "quota used"
    assert await keys(repo, error="no such text") == []


async def test_a_concurrency_key_matches_exactly(pool: asyncpg.Pool, repo: JobRepository) -> None:
    await seed(pool)
    assert await keys(repo, concurrency_key="acme") == ["INV-3", "inv%1", "inv-2", "inv-1"]
    assert await keys(repo, concurrency_key="Acme", state="dead") == ["inv_1", "inv-10"]


async def test_a_bulk_selection_by_a_search_takes_the_jobs_the_list_shows(
    pool: asyncpg.Pool,
) -> None:
    await seed(pool)
    store = BulkStore(pool)
    fence = await store.fence()
    selection = Selection(filters=parse_job_filter({"key_prefix": "inv-", "error": "billing"}))
    assert await store.count(selection, fence, 1000) == {"dead": 2}
    sample = await store.sample(selection, fence, 10)
    assert [r["key"] for r in sample] == ["inv-10", "inv-1"]
