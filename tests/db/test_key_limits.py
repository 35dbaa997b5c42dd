"""Per-key limits on real PostgreSQL (issue 22 point 4, migration 024): every concurrency key of a
queue (the job's tenant unless it names another, migration 023) gets the queue's key_max_inflight,
key_rate_per_s and key_burst for all claimers together; an override changes them for one key; a
key at its limit never blocks the others, in the same claim. Several connections stand in for
several daemons, on both claims: in process (claim_ready) and RabbitMQ's (claim_delivered).
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from dispatcher.db.jobs import JobRepository
from dispatcher.db.registry import Limits
from dispatcher.db.relay import RelayRepository
from dispatcher.model import NewJob
from tests.db.test_global_limits import CAPABILITIES

NO_KEY_LIMITS: Limits = (None, None, None)


async def setup(repo: JobRepository, key_limits: Limits, jobs: dict[str, int]) -> None:
    """Queue "default" (no queue limits) whose keys get `key_limits` (rate, burst, in flight);
    `jobs`: ready jobs per tenant (= concurrency key), enqueued key by key."""
    await repo.sync_registry(
        {"default": (3, 3600)},
        {"work": ("python", 1)},
        limits={"default": (None, None, None)},
        key_limits={"default": key_limits},
    )
    for tenant, n in jobs.items():
        await repo.enqueue_many(
            [
                NewJob(key=f"{tenant}-{i}", handler="work", payload={}, tenant=tenant)
                for i in range(n)
            ]
        )


async def running_by_key(pool: asyncpg.Pool) -> dict[str, int]:
    rows = await pool.fetch(
        "SELECT concurrency_key, count(*) AS n FROM dispatcher.jobs WHERE state = 'running'"
        " GROUP BY concurrency_key"
    )
    return {r["concurrency_key"]: r["n"] for r in rows}


async def claim(repo: JobRepository, n: int, owner: str = "d0") -> list[str]:
    jobs, *_ = await repo.claim_limited("default", n, CAPABILITIES, owner, 60)
    return [j.tenant for j in jobs]


async def test_the_default_key_is_the_tenant(repo: JobRepository) -> None:
    await setup(repo, NO_KEY_LIMITS, {"acct-1": 1})
    assert await repo.pool.fetchval("SELECT concurrency_key FROM dispatcher.jobs") == "acct-1"


async def test_every_key_gets_the_queues_inflight_cap_across_claimers(
    repo: JobRepository,
) -> None:
    await setup(repo, (None, None, 2), {"a": 50, "b": 50, "c": 50})
    for _ in range(3):
        await asyncio.gather(*(claim(repo, 20, f"d{i}") for i in range(4)))
        assert await running_by_key(repo.pool) == {"a": 2, "b": 2, "c": 2}


async def test_a_key_at_its_limit_does_not_block_the_others_in_the_same_claim(
    repo: JobRepository,
) -> None:
    # one tenant whose 500 oldest jobs share key "a", then 5 of key "b" and 5 of key "c": a
    # claim of 10 must reach "b" and "c" at once, not return a's 2 and stop; and the next
    # claims must not pick a's held jobs again and again ahead of the others
    await setup(repo, (None, None, 2), {"t": 510})
    for table in ("job_state", "intents"):  # where the doors write a job's key (023)
        await repo.pool.execute(
            f"UPDATE dispatcher.{table} SET concurrency_key = CASE"
            f" WHEN id > (SELECT min(id) + 504 FROM dispatcher.{table}) THEN 'c'"
            f" WHEN id > (SELECT min(id) + 499 FROM dispatcher.{table}) THEN 'b' ELSE 'a' END"
        )
    assert len(await claim(repo, 10)) == 2  # a's two: the pick takes the 10 oldest
    assert len(await claim(repo, 10)) == 4  # "a" is at its cap: skipped, b's and c's start
    assert await running_by_key(repo.pool) == {"a": 2, "b": 2, "c": 2}
    assert await claim(repo, 10) == []  # every key is at its cap now
    # one of a's jobs ends: the next claim starts exactly one more of a's
    row = await repo.pool.fetchrow(
        "SELECT id, attempt, lease_owner FROM dispatcher.jobs"
        " WHERE state = 'running' AND concurrency_key = 'a' LIMIT 1"
    )
    await repo.complete([row["id"]], [row["attempt"]], [None], row["lease_owner"])
    assert len(await claim(repo, 10)) == 1
    assert await running_by_key(repo.pool) == {"a": 2, "b": 2, "c": 2}


async def test_the_key_rate_holds_and_its_held_jobs_start_when_a_token_is_back(
    repo: JobRepository,
) -> None:
    await setup(repo, (5.0, 2, None), {"a": 20, "b": 20})
    assert sorted(await claim(repo, 20)) == ["a", "a", "b", "b"]  # each key's burst
    held = await repo.claim_limited("default", 20, CAPABILITIES, "d0", 60)
    assert held.jobs == [] and held.wait_s is not None and held.wait_s <= 0.05  # look again soon
    assert held.key_throttled  # counted per queue (dispatcher_key_throttled_claims)
    await asyncio.sleep(0.25)  # one token per key is back after 0.2 s at 5/s
    assert sorted(await claim(repo, 20)) == ["a", "b"]


async def test_an_override_changes_one_keys_limits(repo: JobRepository) -> None:
    await setup(repo, (None, None, 1), {"a": 20, "b": 20})
    await repo.pool.execute(
        "INSERT INTO dispatcher.key_limits (queue, key, max_inflight) VALUES ('default', 'b', 4)"
    )
    await claim(repo, 20)
    assert await running_by_key(repo.pool) == {"a": 1, "b": 4}


async def test_an_override_limits_a_key_of_a_queue_without_key_limits(
    repo: JobRepository,
) -> None:
    await setup(repo, NO_KEY_LIMITS, {"a": 20, "b": 20})
    await repo.pool.execute(
        "INSERT INTO dispatcher.key_limits (queue, key, max_inflight) VALUES ('default', 'a', 3)"
    )
    await claim(repo, 40)
    assert await running_by_key(repo.pool) == {"a": 3, "b": 20}


async def test_jobs_without_a_key_are_not_limited(repo: JobRepository) -> None:
    await setup(repo, (None, None, 1), {"": 10})
    assert len(await claim(repo, 20)) == 10


async def test_the_rabbitmq_claim_holds_key_limits_and_refuses_held_deliveries(
    repo: JobRepository,
) -> None:
    await setup(repo, (None, None, 2), {"a": 6, "b": 2})
    relay = RelayRepository(repo.pool)
    await repo.pool.execute("UPDATE dispatcher.intake_settings SET ready_outbox = true")
    rows = await repo.pool.fetch(
        "SELECT id, attempt, concurrency_key FROM dispatcher.jobs ORDER BY concurrency_key, id"
    )
    delivered = [(r["id"], r["attempt"]) for r in rows]  # a's six first, then b's two
    claimed = await relay.claim_delivered("default", delivered, CAPABILITIES, "d0", 60)
    assert sorted(j.tenant for j in claimed.jobs) == ["a", "a", "b", "b"]
    a_held = {r["id"] for r in rows if r["concurrency_key"] == "a"} - {j.id for j in claimed.jobs}
    # a's other four go back to the relay (acked here, published again shortly), not held
    assert claimed.refused == a_held and not (claimed.eligible & a_held)
    assert claimed.key_held == 4
    assert (
        await repo.pool.fetchval(
            "SELECT count(*) FROM dispatcher.outbox WHERE job_id = ANY ($1::bigint[])", list(a_held)
        )
        == 4
    )


async def test_one_rabbitmq_claim_holds_ends_and_starts_each_job_by_its_own_verdict(
    repo: JobRepository,
) -> None:
    """Keys holding jobs back, a job past its time to live and jobs that start, all in one
    claim of deliveries (the statement tests each against the ids its key holds back)."""
    await setup(repo, (None, None, 2), {"a": 6, "b": 3})
    relay = RelayRepository(repo.pool)
    await repo.pool.execute("UPDATE dispatcher.intake_settings SET ready_outbox = true")
    rows = await repo.pool.fetch(
        "SELECT id, attempt, concurrency_key FROM dispatcher.jobs ORDER BY concurrency_key, id"
    )
    late = next(r["id"] for r in rows if r["concurrency_key"] == "b")
    await repo.pool.execute(
        "UPDATE dispatcher.job_state SET expires_at = now() - interval '1 second' WHERE id = $1",
        late,
    )
    claimed = await relay.claim_delivered(
        "default", [(r["id"], r["attempt"]) for r in rows], CAPABILITIES, "d0", 60
    )
    started = {j.id for j in claimed.jobs}
    a_ids = {r["id"] for r in rows if r["concurrency_key"] == "a"}
    b_ids = {r["id"] for r in rows if r["concurrency_key"] == "b"}
    # a: two start, four are held back and refused; b: the late one ends, its two others start
    # (the late one took none of b's two places)
    assert len(started & a_ids) == 2 and started & b_ids == b_ids - {late}
    assert claimed.refused == a_ids - started and claimed.key_held == 4
    assert claimed.expired == 1 and late not in claimed.eligible | claimed.refused
    state = await repo.pool.fetchrow(
        "SELECT state, dead_reason FROM dispatcher.jobs WHERE id = $1", late
    )
    assert (state["state"], state["dead_reason"]) == ("dead", "expired")


@pytest.mark.parametrize(
    ("sql", "constraint"),
    [
        ("UPDATE dispatcher.queues SET key_max_inflight = 0", "queues_key_max_inflight_min"),
        ("UPDATE dispatcher.queues SET key_rate_per_s = 3", "queues_key_rate_needs_a_burst"),
        (
            "INSERT INTO dispatcher.key_limits (queue, key) VALUES ('default', 'a')",
            "key_limits_limit_something",
        ),
        (
            "INSERT INTO dispatcher.key_limits (queue, key, max_inflight)"
            " VALUES ('default', '', 1)",
            "key_limits_key_length",
        ),
    ],
)
async def test_bad_key_limits_are_refused_at_the_sql_door(
    pool: asyncpg.Pool, sql: str, constraint: str
) -> None:
    with pytest.raises(asyncpg.CheckViolationError, match=constraint):
        await pool.execute(sql)
    assert await pool.fetchval("SELECT count(*) FROM dispatcher.key_limits") == 0
