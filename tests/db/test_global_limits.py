"""Global limits on real PostgreSQL (migration 013): a queue's token bucket and in-flight cap hold
for every claimer together, because each claim asks the queue's registry row first. Several
connections stand in for several daemons; the three-process test is tests/e2e/test_global_limits.
"""

from __future__ import annotations

import asyncio

import pytest

from dispatcher.db.jobs import JobRepository
from dispatcher.model import NewJob

CAPABILITIES = ["work:1"]


async def setup(
    repo: JobRepository, jobs: int, rate: float | None, burst: int, inflight: int | None
):
    await repo.sync_registry(
        {"default": (3, 3600)}, {"work": ("python", 1)}, limits={"default": (rate, burst, inflight)}
    )
    await repo.enqueue_many([NewJob(key=f"k{i}", handler="work", payload={}) for i in range(jobs)])


async def running(repo: JobRepository) -> int:
    return int(
        await repo.pool.fetchval("SELECT count(*) FROM dispatcher.jobs WHERE state = 'running'")
    )


async def test_concurrent_claims_never_start_more_than_the_burst(repo: JobRepository) -> None:
    # a rate so low that no token refills during the test: the burst is all there is
    await setup(repo, 200, rate=0.001, burst=25, inflight=None)
    results = await asyncio.gather(
        *(repo.claim_limited("default", 100, CAPABILITIES, f"d{i}", 60) for i in range(6))
    )
    assert sum(len(jobs) for jobs, *_ in results) == 25
    assert await running(repo) == 25
    # spent: the next claim gets nothing and is told how long until a token is back
    jobs, _, wait_s, *_ = await repo.claim_limited("default", 100, CAPABILITIES, "d0", 60)
    assert jobs == []
    assert wait_s is not None and wait_s > 100


async def test_concurrent_claims_never_exceed_the_inflight_cap(repo: JobRepository) -> None:
    await setup(repo, 300, rate=None, burst=1, inflight=7)
    for _ in range(5):
        await asyncio.gather(
            *(repo.claim_limited("default", 50, CAPABILITIES, f"d{i}", 60) for i in range(6))
        )
        assert await running(repo) == 7
    # completing frees exactly that many slots, for any claimer
    ids = await repo.pool.fetch(
        "SELECT id, attempt FROM dispatcher.jobs WHERE state = 'running' LIMIT 3"
    )
    by_owner = await repo.pool.fetch(
        "SELECT lease_owner, array_agg(id) ids, array_agg(attempt) atts FROM dispatcher.jobs"
        " WHERE id = ANY($1::bigint[]) GROUP BY lease_owner",
        [r["id"] for r in ids],
    )
    for row in by_owner:
        await repo.complete(
            list(row["ids"]), list(row["atts"]), [None] * len(row["ids"]), row["lease_owner"]
        )
    jobs, *_ = await repo.claim_limited("default", 50, CAPABILITIES, "d9", 60)
    assert len(jobs) == 3


async def test_tokens_a_claim_did_not_use_are_given_back(repo: JobRepository) -> None:
    await setup(repo, 2, rate=0.001, burst=5, inflight=None)
    jobs, _, wait_s, *_ = await repo.claim_limited("default", 100, CAPABILITIES, "d0", 60)
    assert len(jobs) == 2 and wait_s is None
    await repo.enqueue_many([NewJob(key=f"more{i}", handler="work", payload={}) for i in range(9)])
    jobs, *_ = await repo.claim_limited("default", 100, CAPABILITIES, "d0", 60)
    assert len(jobs) == 3  # 5 - 2, not 5 - 100


@pytest.mark.parametrize("paused", [False, True])
async def test_a_queue_without_limits_takes_no_lock(repo: JobRepository, paused: bool) -> None:
    await setup(repo, 50, rate=None, burst=1, inflight=None)
    if paused:
        await repo.set_queue_paused("default", True)
    async with repo.pool.acquire() as holder, holder.transaction():
        # another transaction holds the registry row: an unlimited queue's claim does not wait
        await holder.execute("SELECT 1 FROM dispatcher.queues WHERE name = 'default' FOR UPDATE")
        jobs, *_ = await asyncio.wait_for(
            repo.claim_limited("default", 100, CAPABILITIES, "d0", 60), 10
        )
    assert len(jobs) == (0 if paused else 50)


async def test_lowering_the_burst_caps_the_tokens_held(repo: JobRepository) -> None:
    await setup(repo, 100, rate=0.001, burst=40, inflight=None)
    await repo.sync_registry(
        {"default": (3, 3600)}, {"work": ("python", 1)}, limits={"default": (0.001, 10, None)}
    )
    jobs, *_ = await repo.claim_limited("default", 100, CAPABILITIES, "d0", 60)
    assert len(jobs) == 10
