"""Migration 062: a success's history is kept on its job's state row, not in a row of its own.
Its readers see one history (dispatcher.attempt_history, `JobRepository.attempts`): the success
after the job's earlier attempts, pages walking from one to the other, and a success recorded
before the upgrade shown once, from its old row."""

from __future__ import annotations

import asyncpg
import pytest

from dispatcher.db.jobs import JobRepository
from tests.db.test_attempts import OWNER, claim_one, succeeded_third_time
from tests.db.test_checks_as_domains import STORAGE, jobs_at_version, upgrade_to

pytestmark = pytest.mark.registry({"default": (3, 3600)}, {"work": ("python", 1)})

HISTORY_ROWS = "SELECT count(*) FROM dispatcher.attempts WHERE job_id = $1"


async def test_a_success_is_written_on_its_state_row_and_read_as_history(
    registry: JobRepository,
) -> None:
    repo = registry
    job = await claim_one(repo, "ok")
    await repo.complete(
        [job.id], [job.attempt], [None], OWNER,
        http_statuses=[201], latencies_s=[0.5], excerpts=["y" * 700],
    )  # fmt: skip
    assert await repo.pool.fetchval(HISTORY_ROWS, job.id) == 0
    kept = await repo.pool.fetchrow(
        "SELECT succeeded_by, success_http_status, success_latency_s, success_excerpt"
        "  FROM dispatcher.job_state WHERE id = $1",
        job.id,
    )
    assert tuple(kept) == (OWNER, 201, 0.5, "y" * 500)
    [row] = await repo.attempts(job.id)
    assert (row["attempt"], row["outcome"], row["owner"], row["http_status"]) == (
        1, "succeeded", OWNER, 201,
    )  # fmt: skip
    assert (row["latency_s"], row["excerpt"]) == (0.5, "y" * 500)


async def test_pages_walk_from_the_success_to_the_attempts_before_it(
    registry: JobRepository,
) -> None:
    repo = registry
    job = await succeeded_third_time(repo, "third-time")
    assert await repo.pool.fetchval(HISTORY_ROWS, job.id) == 2  # the two failures only
    seen, cursor = [], None
    while page := await repo.attempts(job.id, before_id=cursor, limit=1):
        seen.append((page[0]["attempt"], page[0]["outcome"]))
        cursor = page[0]["id"]
    assert seen == [(3, "succeeded"), (2, "retried"), (1, "retried")]


async def test_a_failure_still_writes_its_history_row(
    registry: JobRepository,
) -> None:
    repo = registry
    job = await claim_one(repo, "running")
    assert await repo.attempts(job.id) == []  # a running attempt has no history yet
    await repo.record_failure(job, OWNER, permanent=True, delay_s=0, error="bad", reason="invalid")
    assert await repo.pool.fetchval(HISTORY_ROWS, job.id) == 1
    assert [r["outcome"] for r in await repo.attempts(job.id)] == ["dead"]


async def test_a_stale_completion_keeps_nothing_on_the_row(registry: JobRepository) -> None:
    repo = registry
    job = await claim_one(repo, "stale")
    assert await repo.complete([job.id], [job.attempt], [None], "someone:else") == set()
    state = await repo.pool.fetchval(
        "SELECT row(state, succeeded_by) FROM dispatcher.job_state WHERE id = $1", job.id
    )
    assert state == ("running", None)
    assert await repo.attempts(job.id) == []


async def test_the_upgrade_keeps_each_earlier_success_once(empty_db_url: str) -> None:
    conn = await asyncpg.connect(empty_db_url)
    try:
        done, waiting, _ = await jobs_at_version(conn, 61)
        # a success as 061's completion wrote it: the state row ended, a history row beside it
        await conn.execute(
            "UPDATE dispatcher.job_state SET state = 'succeeded', attempt = 1,"
            "       started_at = now(), finished_at = now() WHERE id = $1",
            done,
        )
        await conn.execute(
            "INSERT INTO dispatcher.attempts (job_id, attempt, owner, started_at, finished_at,"
            "                                 outcome, http_status)"
            " VALUES ($1, 1, 'old:1', now(), now(), 'succeeded', 204)",
            done,
        )
        storage = dict(await conn.fetch(STORAGE))
        assert await upgrade_to(conn, 62) == ["062_success_on_the_state_row.sql"]
        assert dict(await conn.fetch(STORAGE)) == storage  # no table rewritten, no index built
        history = await conn.fetch(
            "SELECT job_id, outcome, owner, http_status FROM dispatcher.attempt_history"
        )
        assert [tuple(r) for r in history] == [(done, "succeeded", "old:1", 204)]
        assert await conn.fetchval("SELECT count(*) FROM dispatcher.jobs") == 3
        assert await conn.fetchval(
            "SELECT state FROM dispatcher.jobs WHERE id = $1", waiting
        ) == "scheduled"  # fmt: skip
    finally:
        await conn.close()
