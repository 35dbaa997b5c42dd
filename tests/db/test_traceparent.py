"""The trace context stored with a job: written with the jobs intake creates, in the same
transaction; kept by a retried request's existing job; handed to the claimed Job; and only ever
a well-formed version-00 value."""

from __future__ import annotations

from dataclasses import fields

import asyncpg
import pytest

from dispatcher.db.jobs import CLAIM_JOB_COLUMNS, JobRepository
from dispatcher.db.queries import query
from dispatcher.model import Job, NewJob

TARGET = {"url": "https://hooks.example.com/x"}
FIRST = f"00-{'a' * 32}-{'b' * 16}-01"
SECOND = f"00-{'c' * 32}-{'d' * 16}-00"


@pytest.mark.parametrize("name", ["claim_ready", "claim_delivered"])
async def test_the_claims_return_a_jobs_fields_first_in_the_dataclasss_order(
    pool: asyncpg.Pool, name: str
) -> None:
    """The claims build Job from row positions: a column added to one side only would shift
    every later field (a payload read as a target, the trace context as the lateness)."""
    async with pool.acquire() as conn:
        statement = await conn.prepare(query(name))
        columns = [attribute.name for attribute in statement.get_attributes()]
    built = [f.name for f in fields(Job) if f.init and f.name != "log_fields"]
    assert len(built) == CLAIM_JOB_COLUMNS
    assert columns[:CLAIM_JOB_COLUMNS] == built


async def test_a_traced_enqueue_stores_the_context_of_the_jobs_it_creates(
    repo: JobRepository,
) -> None:
    first = [
        NewJob(key=f"t-{i}", handler="http", payload={}, target=TARGET, traceparent=FIRST)
        for i in range(3)
    ]
    assert {r.outcome for r in await repo.enqueue_many(first)} == {"created"}
    # the same requests again, in another trace: the jobs exist, their context stays
    again = [
        NewJob(key=f"t-{i}", handler="http", payload={}, target=TARGET, traceparent=SECOND)
        for i in range(3)
    ]
    again.append(NewJob(key="t-new", handler="http", payload={}, target=TARGET, traceparent=SECOND))
    outcomes = [r.outcome for r in await repo.enqueue_many(again)]
    assert outcomes == ["existing", "existing", "existing", "created"]
    # an untraced item beside traced ones stores nothing
    await repo.enqueue_many(
        [
            NewJob(key="u-1", handler="http", payload={}, target=TARGET),
            NewJob(key="u-2", handler="http", payload={}, target=TARGET, traceparent=FIRST),
        ]
    )
    rows = await repo.pool.fetch("SELECT key, traceparent FROM dispatcher.jobs")
    assert {r["key"]: r["traceparent"] for r in rows} == {
        "t-0": FIRST,
        "t-1": FIRST,
        "t-2": FIRST,
        "t-new": SECOND,
        "u-1": None,
        "u-2": FIRST,
    }
    jobs, _ = await repo.claim("default", 10, ["http:1"], "owner:1", 60.0)
    assert {j.key: j.traceparent for j in jobs} == {r["key"]: r["traceparent"] for r in rows}
    assert all(j.payload == {} and j.target == TARGET for j in jobs)


async def test_a_refused_traced_batch_stores_nothing(repo: JobRepository) -> None:
    batch = [
        NewJob(key="ok", handler="http", payload={}, target=TARGET, traceparent=FIRST),
        NewJob(key="bad", handler="no-such-handler", payload={}, traceparent=FIRST),
    ]
    with pytest.raises(asyncpg.PostgresError, match="unknown handler"):
        await repo.enqueue_many(batch)
    assert await repo.pool.fetchval("SELECT count(*) FROM dispatcher.jobs") == 0


@pytest.mark.parametrize(
    "value",
    [
        "garbage",
        FIRST.upper(),
        f"01-{'a' * 32}-{'b' * 16}-01",  # only version 00 is stored
        f"00-{'a' * 32}-{'b' * 16}-02",  # only the sampled flag is kept
        f"{FIRST}-extra",
    ],
)
async def test_the_database_refuses_a_malformed_traceparent(
    repo: JobRepository, value: str
) -> None:
    """A value written by hand never reaches the tracer in a claim."""
    (job,) = await repo.enqueue_many([NewJob(key="k", handler="http", payload={}, target=TARGET)])
    with pytest.raises(asyncpg.CheckViolationError, match="jobs_traceparent_w3c"):
        await repo.pool.execute(
            "UPDATE dispatcher.jobs SET traceparent = $2 WHERE id = $1", job.id, value
        )
