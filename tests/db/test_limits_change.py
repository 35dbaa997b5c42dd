"""Limiter state that outlives a limits change, on real PostgreSQL (issue 22, "lowering a queue's
limits stalls it"; migration 024).

A queue's limiter keeps state between claims: the bucket's tokens, the permits parked in claim
slots (migration 016) and the count of permits parked at the last refill
(`queues.permits_parked`). Each must follow a change of `rate_per_s`, `burst` or
`max_inflight` at once, whichever door changed them (the daemon's start with another file, or a
plain UPDATE): after the change the next start comes within `1 / rate + 1 s` and the new limits
hold from the first claim on. The daemon-level tests are tests/e2e/test_limits_change.py.
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from dispatcher.db import schema
from dispatcher.db.jobs import JobRepository
from dispatcher.db.pool import connect
from tests.db.test_claim_permits import more_jobs, parked
from tests.db.test_global_limits import CAPABILITIES, running, setup


async def grant(db: asyncpg.Pool, wanted: int) -> tuple[int, float | None]:
    row = await db.fetchrow("SELECT granted, wait_s FROM dispatcher.claim_grant('q', $1)", wanted)
    assert row is not None
    return int(row["granted"]), row["wait_s"]


async def grants_until_refused(db: asyncpg.Pool) -> int:
    """Grants of one, one after another, until one is refused: the bucket's level now."""
    total = 0
    while (await grant(db, 1))[0]:
        total += 1
        assert total < 10_000
    return total


async def test_lowering_the_limits_after_permits_were_parked_does_not_stall(
    pool: asyncpg.Pool,
) -> None:
    # the reproduction: limits 1000/s, burst 1000, 2,000 in flight, tokens full; one
    # grant of 100 parks 8 x 100 permits; then the limits are lowered by a plain UPDATE
    await pool.execute(
        """INSERT INTO dispatcher.queues (name, max_attempts, max_retry_age_s, rate_per_s,
                                          burst, max_inflight, tokens)
           VALUES ('q', 3, 3600, 1000, 1000, 2000, 1000)"""
    )
    assert await grant(pool, 100) == (100, None)
    assert (
        await pool.fetchval("SELECT sum(n) FROM dispatcher.claim_permits WHERE queue = 'q'") == 800
    )
    await pool.execute(
        "UPDATE dispatcher.queues SET rate_per_s = 2, burst = 5, max_inflight = 4 WHERE name = 'q'"
    )
    # before migration 024: granted 0, wait_s 398 (the 800 dropped permits still capped the
    # refill at 5 - 800)
    assert await grant(pool, 1) == (1, None)
    # and the new burst holds at once: 5 in all (a refill of 2/s may add one while we look)
    assert 4 <= await grants_until_refused(pool) <= 5
    granted, wait_s = await grant(pool, 1)
    assert granted == 0 and wait_s is not None and 0 < wait_s <= 0.5 + 1e-6
    state = await pool.fetchrow(
        "SELECT tokens, permits_parked FROM dispatcher.queues WHERE name = 'q'"
    )
    assert state["permits_parked"] == 0 and 0 <= state["tokens"] < 1


async def test_the_daemons_door_lowering_the_limits_holds_them_at_once(
    repo: JobRepository,
) -> None:
    # a drain at high limits leaves permits parked; a daemon starts with a lower file
    await setup(repo, 400, rate=1000, burst=1000, inflight=2000)
    jobs, *_ = await repo.claim_limited("default", 20, CAPABILITIES, "d0", 60)
    assert len(jobs) == 20 and await parked(repo) == 160
    await repo.sync_registry(
        {"default": (3, 3600)}, {"work": ("python", 1)}, limits={"default": (20, 5, 24)}
    )
    assert await parked(repo) == 0
    # 20 running, cap 24: the next claims start 4, at once, and no more
    started = 0
    for i in range(4):
        jobs, *_ = await repo.claim_limited("default", 50, CAPABILITIES, f"d{i}", 60)
        started += len(jobs)
    assert started == 4 and await running(repo) == 24


async def test_after_lowering_the_burst_the_next_start_waits_one_token_at_most(
    repo: JobRepository,
) -> None:
    await setup(repo, 2000, rate=1000, burst=1000, inflight=None)
    results = await asyncio.gather(
        *(repo.claim_limited("default", 100, CAPABILITIES, f"d{i}", 60) for i in range(4))
    )
    assert sum(len(jobs) for jobs, *_ in results) == 400 and await parked(repo) > 0
    await repo.sync_registry(
        {"default": (3, 3600)}, {"work": ("python", 1)}, limits={"default": (2, 5, None)}
    )
    # the bucket keeps what it had, capped at the new burst: 5 start now, then one per 0.5 s
    jobs, _, wait_s, *_ = await repo.claim_limited("default", 50, CAPABILITIES, "d0", 60)
    assert len(jobs) == 5 and wait_s is None
    jobs, _, wait_s, *_ = await repo.claim_limited("default", 50, CAPABILITIES, "d0", 60)
    assert len(jobs) <= 1 and wait_s is not None and wait_s <= 1 / 2 + 1


async def test_raising_the_limits_after_a_slow_phase_starts_at_once(repo: JobRepository) -> None:
    await setup(repo, 300, rate=0.001, burst=3, inflight=3)
    jobs, *_ = await repo.claim_limited("default", 50, CAPABILITIES, "d0", 60)
    assert len(jobs) == 3
    await repo.sync_registry(
        {"default": (3, 3600)}, {"work": ("python", 1)}, limits={"default": (1000, 100, 100)}
    )
    # the spent bucket refills at the new rate: within 1 / rate + 1 s, many more start
    started = 0
    deadline = asyncio.get_running_loop().time() + 1 / 1000 + 1
    while started < 97 and asyncio.get_running_loop().time() < deadline:
        jobs, *_ = await repo.claim_limited("default", 97 - started, CAPABILITIES, "d0", 60)
        started += len(jobs)
    assert started == 97 and await running(repo) == 100


async def test_pause_and_resume_keep_no_stale_limiter_state(repo: JobRepository) -> None:
    await setup(repo, 300, rate=10, burst=5, inflight=None)
    await repo.set_queue_paused("default", True)
    for i in range(30):  # paused claims grant, start nothing, and give everything back
        jobs, *_ = await repo.claim_limited("default", 5, CAPABILITIES, f"d{i % 3}", 60)
        assert jobs == []
    await repo.set_queue_paused("default", False)
    jobs, _, wait_s, *_ = await repo.claim_limited("default", 50, CAPABILITIES, "d0", 60)
    assert len(jobs) == 5 and wait_s is None  # the full burst at once, and no more
    jobs, _, wait_s, *_ = await repo.claim_limited("default", 50, CAPABILITIES, "d0", 60)
    assert len(jobs) <= 1 and wait_s is not None and wait_s <= 1 / 10 + 1


async def test_a_rate_without_a_burst_is_refused_at_the_sql_door(pool: asyncpg.Pool) -> None:
    with pytest.raises(asyncpg.CheckViolationError, match="queues_rate_needs_a_burst"):
        await pool.execute(
            "UPDATE dispatcher.queues SET rate_per_s = 5, burst = NULL WHERE name = 'default'"
        )
    row = await pool.fetchrow(
        "SELECT rate_per_s, burst FROM dispatcher.queues WHERE name = 'default'"
    )
    assert (row["rate_per_s"], row["burst"]) == (None, None)  # unchanged


async def test_the_migration_makes_a_bucket_in_debt_whole(empty_db_url: str) -> None:
    conn = await connect(empty_db_url)
    try:
        await schema.migrate(conn, upto=22)
        # the state the defect left behind: tokens far below zero, old permits counted
        await conn.execute(
            "UPDATE dispatcher.queues SET rate_per_s = 2, burst = 5, tokens = -795,"
            " permits_parked = 800 WHERE name = 'default'"
        )
        await schema.migrate(conn)
        row = await conn.fetchrow(
            "SELECT granted, wait_s FROM dispatcher.claim_grant('default', 1)"
        )
        assert (row["granted"], row["wait_s"]) == (1, None) or row["wait_s"] <= 1 / 2 + 1
    finally:
        await conn.close()


async def test_permits_given_back_after_a_change_never_pass_the_new_burst(
    repo: JobRepository,
) -> None:
    await setup(repo, 100, rate=0.001, burst=40, inflight=None)
    jobs, *_ = await repo.claim_limited("default", 4, CAPABILITIES, "d0", 60)
    assert len(jobs) == 4 and await parked(repo) == 32  # 4 left as tokens, 32 parked
    await repo.sync_registry(
        {"default": (3, 3600)}, {"work": ("python", 1)}, limits={"default": (0.001, 10, None)}
    )
    await more_jobs(repo, "more", 100)
    started = 0
    while jobs := (await repo.claim_limited("default", 4, CAPABILITIES, "d0", 60))[0]:
        started += len(jobs)
    assert started == 10  # the new burst, no more, no less
