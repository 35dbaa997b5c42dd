"""The attempt history on real PostgreSQL: each statement that ends an attempt writes its row
(success, retry, dead, cancel, lease expiry, drain release) with what the worker knew; a write
fenced off by the lease writes none; the Retry-After budget decision; pruning takes the rows
with their job."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from dispatcher.config.settings import RetentionSettings
from dispatcher.db.jobs import JobRepository
from dispatcher.engine.pruning import Pruner
from dispatcher.model import Job, NewJob

# the registry a daemon writes at start (the shared `registry` fixture registers it)
pytestmark = pytest.mark.registry({"default": (3, 3600)}, {"work": ("python", 1)})

OWNER = "host:1:abc"
CAPABILITIES = ["work:1"]


async def claim_one(repo: JobRepository, key: str, **fields: Any) -> Job:
    await repo.enqueue_many([NewJob(key=key, handler="work", payload={}, **fields)])
    jobs, _ = await repo.claim("default", 10, CAPABILITIES, OWNER, 60)
    [job] = [j for j in jobs if j.key == key]
    return job


async def history(repo: JobRepository, job_id: int) -> list[dict[str, Any]]:
    return await repo.attempts(job_id)


async def test_a_success_records_status_latency_and_a_bounded_excerpt(
    registry: JobRepository,
) -> None:
    repo = registry
    job = await claim_one(repo, "ok")
    done = await repo.complete(
        [job.id],
        [job.attempt],
        [{"status": 200}],
        OWNER,
        http_statuses=[200],
        latencies_s=[0.25],
        excerpts=["x" * 600],
    )
    assert done == {(job.id, 1)}
    [row] = await history(repo, job.id)
    started = await repo.pool.fetchval(
        "SELECT started_at FROM dispatcher.jobs WHERE id = $1", job.id
    )
    assert row["started_at"] == started and row["finished_at"] >= started
    assert (row["attempt"], row["owner"], row["outcome"], row["reason"]) == (
        1,
        OWNER,
        "succeeded",
        None,
    )
    assert (row["http_status"], row["latency_s"], row["excerpt"]) == (200, 0.25, "x" * 500)


async def test_a_stale_or_foreign_completion_records_nothing(registry: JobRepository) -> None:
    repo = registry
    job = await claim_one(repo, "fenced")
    assert await repo.complete([job.id], [job.attempt + 1], [None], OWNER) == set()
    assert await repo.complete([job.id], [job.attempt], [None], "someone-else") == set()
    assert (
        await repo.record_failure(
            job, "someone-else", permanent=False, delay_s=1, error="x", reason="error"
        )
        is None
    )
    assert await history(repo, job.id) == []


async def test_failures_record_retried_then_dead_with_the_reason(
    registry: JobRepository,
) -> None:
    repo = registry
    job = await claim_one(repo, "flaky", max_attempts=2)
    state = await repo.record_failure(
        job,
        OWNER,
        permanent=False,
        delay_s=0,
        error="HTTP 503: " + "busy " * 200,
        reason="rate_limited",
        http_status=503,
        latency_s=0.5,
    )
    assert state == ("scheduled", None)
    await repo.scan_due(10)
    [job] = (await repo.claim("default", 10, CAPABILITIES, OWNER, 60))[0]
    assert job.attempt == 2
    state = await repo.record_failure(
        job, OWNER, permanent=False, delay_s=0, error="attempt timed out", reason="timeout"
    )
    assert state == ("dead", "max_attempts")
    newest, oldest = await history(repo, job.id)
    assert (oldest["attempt"], oldest["outcome"], oldest["reason"]) == (
        1,
        "retried",
        "rate_limited",
    )
    assert (oldest["http_status"], oldest["latency_s"]) == (503, 0.5)
    assert len(oldest["excerpt"]) == 500 and oldest["excerpt"].startswith("HTTP 503: busy")
    assert (newest["attempt"], newest["outcome"], newest["reason"]) == (2, "dead", "max_attempts")
    assert newest["excerpt"] == "attempt timed out"


async def test_a_permanent_failure_and_a_cancelled_attempt(registry: JobRepository) -> None:
    repo = registry
    rejected = await claim_one(repo, "rejected")
    await repo.record_failure(
        rejected,
        OWNER,
        permanent=True,
        delay_s=0,
        error="HTTP 400",
        reason="http_4xx",
        http_status=400,
    )
    [row] = await history(repo, rejected.id)
    assert (row["outcome"], row["reason"], row["http_status"]) == ("dead", "http_4xx", 400)

    cancelled = await claim_one(repo, "cancelled")
    await repo.cancel(cancelled.id)  # running: finishes its attempt, then is not retried
    await repo.record_failure(
        cancelled, OWNER, permanent=False, delay_s=5, error="boom", reason="error"
    )
    [row] = await history(repo, cancelled.id)
    assert (row["outcome"], row["reason"]) == ("cancelled", "error")


@pytest.mark.parametrize(
    ("retry_after_s", "delay_s", "expected"),
    [
        (7200.0, 7200.0, ("dead", "retry_after_beyond_age")),
        # the backoff set a longer delay than the target asked for: the age ran out, that's all
        (1800.0, 7200.0, ("dead", "max_retry_age")),
        (None, 7200.0, ("dead", "max_retry_age")),  # no Retry-After (or a handler's own delay)
        (1800.0, 1800.0, ("scheduled", None)),  # within the 3,600 s retry age: honoured as is
    ],
)
async def test_a_delay_the_target_asked_for_is_bounded_by_the_retry_age_only(
    registry: JobRepository,
    retry_after_s: float | None,
    delay_s: float,
    expected: tuple[str, Any],
) -> None:
    repo = registry
    job = await claim_one(repo, "throttled")
    state = await repo.record_failure(
        job,
        OWNER,
        permanent=False,
        delay_s=delay_s,
        error="HTTP 429",
        reason="rate_limited",
        retry_after_s=retry_after_s,
        http_status=429,
    )
    assert state == expected
    wait_s = await repo.pool.fetchval(
        "SELECT extract(epoch FROM due_at - now())::float8 FROM dispatcher.jobs WHERE id = $1",
        job.id,
    )
    if expected[0] == "scheduled":
        assert wait_s == pytest.approx(delay_s, abs=5)
    [attempt] = await history(repo, job.id)
    outcome = "retried" if expected[0] == "scheduled" else expected[0]
    assert (attempt["outcome"], attempt["reason"], attempt["http_status"]) == (
        outcome,
        expected[1] or "rate_limited",
        429,
    )


async def test_an_expired_lease_records_lease_expired_naming_the_lost_owner(
    registry: JobRepository,
) -> None:
    repo = registry
    job = await claim_one(repo, "lost")
    await repo.pool.execute(
        "UPDATE dispatcher.jobs SET lease_expires_at = now() - interval '1 s' WHERE id = $1",
        job.id,
    )
    assert await repo.rescue_expired_leases(10) == {"ready": 1}
    [row] = await history(repo, job.id)
    assert (row["attempt"], row["owner"], row["outcome"], row["reason"]) == (
        1,
        OWNER,
        "lease_expired",
        None,
    )
    assert row["excerpt"] == f"lease of {OWNER} expired during attempt 1"
    # the late end of the stale attempt changes nothing, and records nothing
    assert await repo.complete([job.id], [1], [None], OWNER) == set()
    assert len(await history(repo, job.id)) == 1


async def test_a_drain_release_records_the_number_the_next_attempt_carries_again(
    registry: JobRepository,
) -> None:
    repo = registry
    job = await claim_one(repo, "drained")
    assert await repo.release_leases([(job.id, job.attempt)], OWNER) == 1
    [again] = (await repo.claim("default", 10, CAPABILITIES, "other:2:def", 60))[0]
    assert again.attempt == job.attempt == 1
    await repo.complete([again.id], [again.attempt], [None], "other:2:def")
    succeeded, released = await history(repo, job.id)
    assert (released["attempt"], released["owner"], released["outcome"]) == (1, OWNER, "released")
    assert (succeeded["attempt"], succeeded["owner"], succeeded["outcome"]) == (
        1,
        "other:2:def",
        "succeeded",
    )


async def succeeded_third_time(repo: JobRepository, key: str) -> Job:
    """A job whose first two attempts failed (retried) and whose third succeeded."""
    job = await claim_one(repo, key, max_attempts=3)
    for _ in range(2):
        await repo.record_failure(
            job, OWNER, permanent=False, delay_s=0, error="again", reason="transient"
        )
        await repo.scan_due(10)
        [job] = (await repo.claim("default", 10, CAPABILITIES, OWNER, 60))[0]
    await repo.complete([job.id], [job.attempt], [None], OWNER)
    return job


async def test_the_history_pages_newest_first(registry: JobRepository) -> None:
    repo = registry
    job = await succeeded_third_time(repo, "paged")
    rows = await repo.attempts(job.id, limit=2)
    assert [r["attempt"] for r in rows] == [3, 2]
    rest = await repo.attempts(job.id, before_id=rows[-1]["id"], limit=2)
    assert [r["attempt"] for r in rest] == [1]


async def test_pruning_a_job_takes_its_history_and_nothing_else(
    registry: JobRepository, pool: asyncpg.Pool
) -> None:
    repo = registry
    old = await claim_one(repo, "old")
    await repo.complete([old.id], [old.attempt], [None], OWNER)
    young = await claim_one(repo, "young")
    await repo.complete([young.id], [young.attempt], [None], OWNER)
    await pool.execute(
        "UPDATE dispatcher.jobs SET finished_at = now() - interval '8 days' WHERE id = $1", old.id
    )
    pruned = await Pruner(repo, RetentionSettings(batch=1000)).run_once()
    assert pruned["succeeded"] == 1
    assert await pool.fetchval("SELECT count(*) FROM dispatcher.jobs WHERE id = $1", old.id) == 0
    assert await history(repo, old.id) == []
    assert len(await history(repo, young.id)) == 1
