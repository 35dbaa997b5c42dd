"""The snooze statement on real PostgreSQL: back to `scheduled` at the asked time (a delay or an
instant, never before now) with the attempt given back and a `snoozed` history row; fenced by
the lease like every write of an attempt; a cancel request wins; the cap counts the snoozes of
the current budget only (an operator's retry starts a new one)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from dispatcher.db.jobs import JobRepository
from dispatcher.model import Job, NewJob

# the registry a daemon writes at start (the shared `registry` fixture registers it)
pytestmark = pytest.mark.registry({"default": (3, 3600)}, {"work": ("python", 1)})
OWNER = "host:1:abc"
CAPABILITIES = ["work:1"]


async def claim(repo: JobRepository, key: str) -> Job:
    await repo.enqueue_many([NewJob(key=key, handler="work", payload={})])
    await repo.pool.execute(  # due now, whatever a snooze set
        "UPDATE dispatcher.jobs SET state = 'ready', due_at = now() WHERE key = $1"
        " AND state = 'scheduled'",
        key,
    )
    jobs, _ = await repo.claim("default", 10, CAPABILITIES, OWNER, 60)
    [job] = [j for j in jobs if j.key == key]
    return job


async def snooze(repo: JobRepository, job: Job, **fields: object) -> tuple[str, str | None] | None:
    values: dict[str, object] = {"delay_s": 0.0, "until": None, "reason": "r", "max_snoozes": 5}
    values.update(fields)
    return await repo.snooze(job, OWNER, **values)  # type: ignore[arg-type]


async def test_a_snooze_waits_as_asked_and_gives_the_attempt_back(
    registry: JobRepository,
) -> None:
    repo = registry
    job = await claim(repo, "later")
    assert await snooze(repo, job, delay_s=120.0, reason="nothing yet", latency_s=0.01) == (
        "scheduled",
        None,
    )
    row = await repo.pool.fetchrow(
        "SELECT j.state, j.attempt, j.due_at - a.finished_at AS wait, j.finished_at"
        "  FROM dispatcher.jobs j JOIN dispatcher.attempt_history a ON a.job_id = j.id"
        " WHERE j.id = $1",
        job.id,
    )
    # the due time and the history row come from one statement's now(): exact
    assert (row["state"], row["attempt"], row["wait"], row["finished_at"]) == (
        "scheduled",
        0,
        timedelta(seconds=120),
        None,
    )
    [history] = await repo.attempts(job.id)
    assert (history["attempt"], history["outcome"], history["reason"], history["excerpt"]) == (
        1,
        "snoozed",
        "snoozed",
        "nothing yet",
    )
    now = await repo.now()
    again = await claim(repo, "later")
    assert again.attempt == 1  # the snooze spent none
    past = now - timedelta(days=1)  # an instant already past: due now, not in the past
    assert await snooze(repo, again, until=past) == ("scheduled", None)
    due = await repo.pool.fetchval("SELECT due_at FROM dispatcher.jobs WHERE id = $1", job.id)
    assert due >= now


async def test_only_the_lease_holder_snoozes_and_a_cancel_wins(registry: JobRepository) -> None:
    repo = registry
    job = await claim(repo, "fenced")
    assert (
        await repo.snooze(job, "someone:else", delay_s=0, until=None, reason="r", max_snoozes=5)
        is None
    )
    assert await repo.pool.fetchval("SELECT state FROM dispatcher.jobs WHERE id = $1", job.id) == (
        "running"
    )
    await repo.cancel(job.id)
    assert await snooze(repo, job) == ("cancelled", None)
    assert [r["outcome"] for r in await repo.attempts(job.id)] == ["cancelled"]


async def test_the_cap_counts_the_snoozes_of_the_current_budget(registry: JobRepository) -> None:
    repo = registry
    for _ in range(2):
        job = await claim(repo, "capped")
        assert await snooze(repo, job, max_snoozes=2) == ("scheduled", None)
    job = await claim(repo, "capped")
    assert await snooze(repo, job, max_snoozes=2) == ("dead", "max_snoozes")
    assert await repo.retry(job.id) is not None  # an operator's retry: a new budget
    job = await claim(repo, "capped")
    assert await snooze(repo, job, max_snoozes=2) == ("scheduled", None)
    far = await claim(repo, "capped")
    assert await snooze(repo, far, delay_s=7200.0) == ("dead", "snoozed_past_retry_age")
