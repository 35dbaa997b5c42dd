"""Claim permits on real PostgreSQL (migration 016): headroom of a queue's global limits parked in
permit slots lets claims run side by side without the queue row's lock, and the limits still
hold for every claimer together. Several connections stand in for several daemons.
"""

from __future__ import annotations

import asyncio
import random

from dispatcher.db.jobs import JobRepository
from dispatcher.model import NewJob
from tests.db.test_global_limits import CAPABILITIES, running, setup


async def parked(repo: JobRepository) -> int:
    return int(
        await repo.pool.fetchval(
            "SELECT coalesce(sum(n), 0) FROM dispatcher.claim_permits WHERE queue = 'default'"
        )
    )


async def more_jobs(repo: JobRepository, prefix: str, n: int) -> None:
    await repo.enqueue_many(
        [NewJob(key=f"{prefix}{i}", handler="work", payload={}) for i in range(n)]
    )


async def claim_in_rounds(repo: JobRepository, claimers: int = 6) -> list[int]:
    """Rounds of `claimers` concurrent claims of 100 until a round starts nothing; the ids
    started. (A plain claim draws on one slot of parked permits: one round may leave the
    permits of other slots to the next.)"""
    ids: list[int] = []
    while True:
        results = await asyncio.gather(
            *(
                repo.claim_limited("default", 100, CAPABILITIES, f"d{i}", 60)
                for i in range(claimers)
            )
        )
        started = [j.id for jobs, *_ in results for j in jobs]
        if not started:
            return ids
        ids += started


async def test_claims_on_parked_permits_do_not_wait_for_the_queue_row(
    repo: JobRepository,
) -> None:
    await setup(repo, 100, rate=1_000_000, burst=100_000, inflight=10_000)
    jobs, *_ = await repo.claim_limited("default", 10, CAPABILITIES, "d0", 60)
    assert len(jobs) == 10
    assert await parked(repo) == 80  # one claim's worth in each of the 8 slots
    async with repo.pool.acquire() as holder, holder.transaction():
        # another claimer holds the registry row: these claims take parked permits instead
        await holder.execute("SELECT 1 FROM dispatcher.queues WHERE name = 'default' FOR UPDATE")
        results = await asyncio.wait_for(
            asyncio.gather(
                *(repo.claim_limited("default", 10, CAPABILITIES, f"d{i}", 60) for i in range(3))
            ),
            10,
        )
    assert [len(jobs) for jobs, *_ in results] == [10, 10, 10]
    assert await parked(repo) == 50


async def test_parked_permits_count_against_the_inflight_cap(repo: JobRepository) -> None:
    await setup(repo, 300, rate=None, burst=1, inflight=30)
    jobs, *_ = await repo.claim_limited("default", 5, CAPABILITIES, "d0", 60)
    assert len(jobs) == 5 and await parked(repo) == 25
    for _ in range(3):
        await asyncio.gather(
            *(repo.claim_limited("default", 50, CAPABILITIES, f"d{i}", 60) for i in range(6))
        )
        assert await running(repo) == 30
    # four complete: exactly four more start, whichever way the claims go
    rows = await repo.pool.fetch(
        "SELECT id, attempt, lease_owner FROM dispatcher.jobs WHERE state = 'running' LIMIT 4"
    )
    for row in rows:
        await repo.complete([row["id"]], [row["attempt"]], [None], row["lease_owner"])
    await asyncio.gather(
        *(repo.claim_limited("default", 50, CAPABILITIES, f"d{i}", 60) for i in range(6))
    )
    assert await running(repo) == 30


async def test_parked_permits_count_against_the_burst(repo: JobRepository) -> None:
    # no token refills during the test: the burst of 25 is all there is, parked or not
    await setup(repo, 200, rate=0.001, burst=25, inflight=None)
    jobs, *_ = await repo.claim_limited("default", 2, CAPABILITIES, "d0", 60)
    assert len(jobs) == 2 and await parked(repo) == 16
    assert len(await claim_in_rounds(repo)) == 23
    assert await running(repo) == 25
    jobs, _, wait_s, *_ = await repo.claim_limited("default", 100, CAPABILITIES, "d0", 60)
    assert jobs == [] and wait_s is not None and wait_s > 100


async def test_a_full_bucket_and_parked_permits_together_stay_within_the_burst(
    repo: JobRepository,
) -> None:
    await setup(repo, 200, rate=50, burst=20, inflight=None)
    jobs, *_ = await repo.claim_limited("default", 2, CAPABILITIES, "d0", 60)
    assert len(jobs) == 2 and await parked(repo) == 16
    await asyncio.sleep(1.0)  # the bucket refills (50/s) up to the burst, less what is parked
    # the refill reads the clock when each claim gets the queue row, not when its transaction
    # began (started_at): bound it by the database clock around all the rounds
    before = await repo.pool.fetchval("SELECT clock_timestamp()")
    ids = await claim_in_rounds(repo)
    span = (await repo.pool.fetchval("SELECT clock_timestamp()") - before).total_seconds()
    assert 20 <= len(ids) <= 20 + 50 * span + 1, span  # a burst, not a burst plus the parked


async def slots(repo: JobRepository) -> list[int]:
    rows = await repo.pool.fetch(
        "SELECT n FROM dispatcher.claim_permits WHERE queue = 'default' ORDER BY slot"
    )
    return [r["n"] for r in rows]


async def test_a_plain_claim_draws_on_one_slot_what_it_starts(repo: JobRepository) -> None:
    """The plain case takes its grant from the fullest slot in its own statements (not through
    claim_grant, whose call was a quarter of a one-job claim's server time): the slot gives
    exactly the jobs started, the other slots and the bucket keep theirs."""
    await setup(repo, 3, rate=1_000_000, burst=100_000, inflight=10_000)
    jobs, *_ = await repo.claim_limited("default", 10, CAPABILITIES, "d0", 60)
    assert len(jobs) == 3 and await slots(repo) == [10] * 8
    tokens = await repo.pool.fetchval("SELECT tokens FROM dispatcher.queues WHERE name = 'default'")
    await more_jobs(repo, "one", 1)
    jobs, *_ = await repo.claim_limited("default", 10, CAPABILITIES, "d0", 60)
    assert len(jobs) == 1 and await slots(repo) == [9] + [10] * 7
    await more_jobs(repo, "twelve", 12)  # more than the fullest slot holds: that slot's 10
    jobs, *_ = await repo.claim_limited("default", 100, CAPABILITIES, "d0", 60)
    assert len(jobs) == 10 and await slots(repo) == [9, 0] + [10] * 6
    assert (
        await repo.pool.fetchval("SELECT tokens FROM dispatcher.queues WHERE name = 'default'")
        == tokens
    )


async def test_permits_a_claim_did_not_use_are_given_back(repo: JobRepository) -> None:
    await setup(repo, 2, rate=0.001, burst=40, inflight=None)
    jobs, *_ = await repo.claim_limited("default", 4, CAPABILITIES, "d0", 60)
    assert len(jobs) == 2  # granted 4 from the bucket, 32 parked; 2 go back to the bucket
    assert await parked(repo) == 32
    jobs, *_ = await repo.claim_limited("default", 4, CAPABILITIES, "d0", 60)
    assert jobs == []  # granted 4 from a slot, nothing ready: the 4 go back to that slot
    assert await parked(repo) == 32
    await more_jobs(repo, "more", 100)
    started = 0
    while jobs := (await repo.claim_limited("default", 4, CAPABILITIES, "d0", 60))[0]:
        started += len(jobs)
    assert started == 38  # 40 - 2: nothing lost, nothing extra


async def test_changing_the_limits_drops_parked_permits(repo: JobRepository) -> None:
    await setup(repo, 100, rate=None, burst=1, inflight=1000)
    jobs, *_ = await repo.claim_limited("default", 10, CAPABILITIES, "d0", 60)
    assert len(jobs) == 10 and await parked(repo) == 80
    await repo.sync_registry(
        {"default": (3, 3600)}, {"work": ("python", 1)}, limits={"default": (None, 1, 15)}
    )
    assert await parked(repo) == 0
    await asyncio.gather(
        *(repo.claim_limited("default", 50, CAPABILITIES, f"d{i}", 60) for i in range(4))
    )
    assert await running(repo) == 15


async def churn(
    repo: JobRepository, claimers: int, seconds: float, seed: int
) -> tuple[int, list[tuple[int, int]]]:
    """`claimers` connections claim random amounts and complete random parts of what they
    hold, for `seconds`; a monitor samples (running, parked) from committed state. Returns the
    jobs started and the samples."""
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + seconds
    samples: list[tuple[int, int]] = []
    started = 0

    async def claimer(i: int) -> None:
        nonlocal started
        held: list[tuple[int, int]] = []
        while loop.time() < stop_at:
            jobs, _, wait_s, *_ = await repo.claim_limited(
                "default", rng.randint(1, 40), CAPABILITIES, f"d{i}", 60
            )
            started += len(jobs)
            held += [(j.id, j.attempt) for j in jobs]
            rng.shuffle(held)
            cut = rng.randint(0, len(held))
            done, held = held[:cut], held[cut:]
            if done:
                await repo.complete(
                    [d[0] for d in done], [d[1] for d in done], [None] * len(done), f"d{i}"
                )
            if not jobs:
                await asyncio.sleep(min(wait_s or 0.005, 0.02))

    async def monitor() -> None:
        while loop.time() < stop_at:
            row = await repo.pool.fetchrow(
                "SELECT (SELECT count(*) FROM dispatcher.jobs WHERE state = 'running')::int,"
                "       (SELECT coalesce(sum(n), 0) FROM dispatcher.claim_permits)::int"
            )
            samples.append((row[0], row[1]))
            await asyncio.sleep(0.002)

    await asyncio.gather(monitor(), *(claimer(i) for i in range(claimers)))
    return started, samples


async def test_the_inflight_cap_holds_under_churn(repo: JobRepository) -> None:
    """Permits are minted, used, given back and the cap binds, all at once: the committed
    running jobs and parked permits never exceed the cap together."""
    await setup(repo, 20_000, rate=None, burst=1, inflight=120)
    started, samples = await churn(repo, claimers=6, seconds=4, seed=13)
    assert max(running for running, _ in samples) == 120  # the cap was reached
    assert any(parked > 0 for _, parked in samples)  # and permits were in play
    assert all(running + parked <= 120 for running, parked in samples)
    assert started > 500


async def test_the_start_rate_holds_under_churn(repo: JobRepository) -> None:
    await setup(repo, 20_000, rate=400, burst=100, inflight=None)
    t0 = await repo.pool.fetchval("SELECT clock_timestamp()")
    started, samples = await churn(repo, claimers=6, seconds=3, seed=7)
    row = await repo.pool.fetchrow(
        # the span on the bucket's own clock: a start's started_at is its transaction's start,
        # which comes before the refill that granted it by however long the claim took to get
        # there (the tenant walk of claim_pick makes that a few milliseconds)
        "SELECT count(*)::int AS n, extract(epoch FROM greatest(max(started_at),"
        "       (SELECT tokens_at FROM dispatcher.queues WHERE name = 'default')) - $1)::float8"
        "       AS span FROM dispatcher.jobs WHERE started_at IS NOT NULL",
        t0,
    )
    assert any(parked > 0 for _, parked in samples)
    assert row["n"] == started
    assert started <= 400 * row["span"] + 100  # rate x t + burst, all claimers together
    assert started >= 0.5 * 400 * row["span"]  # and the bucket was in use, not starved
