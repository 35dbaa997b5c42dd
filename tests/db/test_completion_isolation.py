"""The completer's batched write, on real PostgreSQL, when the database refuses it (invariant 10):
refused for one job's data, the batch is split until that job is found, which ends alone as
`result_unstorable` while the others are written; refused because the database is unreachable,
the batch fails whole, as before (the leases expire and the jobs are retried, never lost)."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from dispatcher.db.jobs import JobRepository
from dispatcher.db.pool import create_pool
from dispatcher.engine.completer import Completer
from dispatcher.model import Job, NewJob

# the registry a daemon writes at start (the shared `registry` fixture registers it)
pytestmark = pytest.mark.registry({"default": (3, 3600)}, {"work": ("python", 1)})

OWNER = "host:1:isolation"
JOBS = 40
REFUSED = {7, 23}  # the jobs whose result the database refuses


async def claim(repo: JobRepository, count: int) -> list[Job]:
    await repo.enqueue_many(
        [NewJob(key=f"job-{i:02d}", handler="work", payload={}) for i in range(count)]
    )
    jobs, _ = await repo.claim("default", count, ["work:1"], OWNER, 60)
    assert len(jobs) == count
    return sorted(jobs, key=lambda j: j.key)


async def states(repo: JobRepository) -> dict[str, tuple[str, str | None]]:
    rows = await repo.pool.fetch("SELECT key, state, dead_reason FROM dispatcher.jobs")
    return {r["key"]: (r["state"], r["dead_reason"]) for r in rows}


async def test_a_batch_refused_for_one_jobs_data_is_written_without_it(
    registry: JobRepository,
) -> None:
    repo = registry
    # A refusal no safe form foresees: the database itself rejects these rows' data
    await repo.pool.execute(
        "ALTER TABLE dispatcher.job_state ADD CONSTRAINT refuse_marked"
        " CHECK (result IS NULL OR NOT result ? 'refuse')"
    )
    jobs = await claim(repo, JOBS)
    results: list[Any] = [{"refuse": True} if i in REFUSED else {"n": i} for i in range(JOBS)]
    completer = Completer(repo, OWNER)
    await completer.start()
    try:
        held = await completer.record_many(jobs, results, [0.01] * JOBS)
    finally:
        await completer.stop()

    assert held == [True] * JOBS  # every outcome was recorded: none left to its lease
    ended = await states(repo)
    for i, job in enumerate(jobs):
        expected = ("dead", "result_unstorable") if i in REFUSED else ("succeeded", None)
        assert ended[job.key] == expected, job.key
    refused = await repo.pool.fetch(
        "SELECT j.last_error, a.outcome, a.reason, a.latency_s FROM dispatcher.jobs j"
        "  JOIN dispatcher.attempt_history a ON a.job_id = j.id WHERE j.key = ANY($1::text[])",
        [jobs[i].key for i in REFUSED],
    )
    assert len(refused) == len(REFUSED)
    for row in refused:
        assert (row["outcome"], row["reason"], row["latency_s"]) == (
            "dead",
            "result_unstorable",
            0.01,
        )
        assert row["last_error"].startswith("the effect succeeded, but its outcome could not")
        assert "refuse_marked" in row["last_error"]  # the database's own reason, for the operator
    stored = await repo.pool.fetch(
        "SELECT key, result FROM dispatcher.jobs WHERE result IS NOT NULL"
    )
    assert {r["key"]: r["result"] for r in stored} == {
        jobs[i].key: {"n": i} for i in range(JOBS) if i not in REFUSED
    }


async def test_an_unreachable_database_fails_the_batch_whole_and_ends_no_job(
    registry: JobRepository, db_url: str
) -> None:
    repo = registry
    jobs = await claim(repo, 5)
    lost = await create_pool(db_url, size=2)
    await lost.close()  # every statement now fails as "pool is closed": an outage, not data
    completer = Completer(JobRepository(lost), OWNER)
    await completer.start()
    try:
        with pytest.raises(asyncpg.InterfaceError):
            await completer.record_many(jobs, [{"n": 1}] * 5, [0.01] * 5)
    finally:
        await completer.stop()
    assert set((await states(repo)).values()) == {("running", None)}  # left to their leases


async def test_an_error_that_is_no_jobs_doing_fails_the_batch_whole_and_ends_no_job(
    registry: JobRepository,
) -> None:
    """A deadlock (or a timeout, an undefined column) met while writing one job's row says
    nothing about that job's data: splitting would end it, or every job, as unstorable."""
    repo = registry
    await repo.pool.execute("""
        CREATE FUNCTION deadlock_on_marked() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.result ? 'marked' THEN
                RAISE EXCEPTION 'deadlock detected (test)' USING ERRCODE = '40P01';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER deadlock_on_marked BEFORE UPDATE ON dispatcher.job_state
           FOR EACH ROW EXECUTE FUNCTION deadlock_on_marked();""")
    jobs = await claim(repo, 6)
    results: list[Any] = [{"marked": True} if i == 2 else {"n": i} for i in range(6)]
    completer = Completer(repo, OWNER)
    await completer.start()
    try:
        with pytest.raises(asyncpg.DeadlockDetectedError):
            await completer.record_many(jobs, results, [0.01] * 6)
    finally:
        await completer.stop()
    assert set((await states(repo)).values()) == {("running", None)}  # left to their leases


async def test_results_that_are_json_arrays_are_stored_as_given(registry: JobRepository) -> None:
    """asyncpg read a list inside a jsonb[] parameter as a dimension of the array: a handler
    returning a JSON array failed its whole batch (found by test_outcome_properties.py)."""
    repo = registry
    results: list[Any] = [[], [1, [2, [3]]], [[[[[[[["deep"]]]]]]]], [{"a": []}], "text", 1.5]
    jobs = await claim(repo, len(results))
    done = await repo.complete([j.id for j in jobs], [j.attempt for j in jobs], results, OWNER)
    assert len(done) == len(results)
    rows = await repo.pool.fetch("SELECT key, result FROM dispatcher.jobs")
    assert {r["key"]: r["result"] for r in rows} == {
        job.key: result for job, result in zip(jobs, results, strict=True)
    }
