"""Limit groups on real PostgreSQL (issue 22 point 2, migration 024): queues naming a group share
its budget (start rate with burst, in-flight cap) across every claimer, keep their own limits
too, and the better group_priority gets a short budget first. Several connections stand in for
several daemons; the daemon test is tests/e2e/test_limit_groups.py.
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from dispatcher.db.jobs import JobRepository
from dispatcher.db.registry import Limits
from dispatcher.model import NewJob
from tests.db.test_global_limits import CAPABILITIES

UNLIMITED: Limits = (None, None, None)


async def setup(
    repo: JobRepository,
    group: Limits,
    queues: dict[str, tuple[Limits, int, int]],
) -> None:
    """Group "g" with `group` limits; each queue with (its own limits, its group_priority, how
    many ready jobs)."""
    await repo.sync_registry(
        {q: (3, 3600) for q in queues},
        {"work": ("python", 1)},
        limits={q: own for q, (own, _, _) in queues.items()},
        groups={"g": group},
        membership={q: ("g", priority) for q, (_, priority, _) in queues.items()},
    )
    for q, (_, _, n) in queues.items():
        await add_jobs(repo, q, n)


async def add_jobs(repo: JobRepository, queue: str, n: int, prefix: str = "") -> None:
    await repo.enqueue_many(
        [
            NewJob(key=f"{prefix}{queue}-{i}", handler="work", payload={}, queue=queue)
            for i in range(n)
        ]
    )


async def claim(repo: JobRepository, queue: str, n: int, owner: str = "d0") -> int:
    jobs, *_ = await repo.claim_limited(queue, n, CAPABILITIES, owner, 60)
    return len(jobs)


async def running(repo: JobRepository, queue: str | None = None) -> int:
    return int(
        await repo.pool.fetchval(
            "SELECT count(*) FROM dispatcher.jobs WHERE state = 'running'"
            " AND ($1::text IS NULL OR queue = $1)",
            queue,
        )
    )


async def parked(repo: JobRepository, queue: str) -> int:
    return int(
        await repo.pool.fetchval(
            "SELECT coalesce(sum(n), 0) FROM dispatcher.claim_permits WHERE queue = $1", queue
        )
    )


async def complete_some(repo: JobRepository, queue: str, n: int) -> None:
    rows = await repo.pool.fetch(
        "SELECT id, attempt, lease_owner FROM dispatcher.jobs"
        " WHERE state = 'running' AND queue = $1 LIMIT $2",
        queue,
        n,
    )
    for row in rows:
        await repo.complete([row["id"]], [row["attempt"]], [None], row["lease_owner"])


async def test_the_queues_of_a_group_share_its_burst(repo: JobRepository) -> None:
    # no refill during the test: the group's burst of 20 is all there is, for both queues
    await setup(
        repo,
        (0.001, 20, None),
        {"a": ((1000, 1000, None), 0, 100), "b": ((1000, 1000, None), 0, 100)},
    )
    counts = await asyncio.gather(
        *(claim(repo, q, 15, f"d{i}") for i in range(3) for q in ("a", "b"))
    )
    assert sum(counts) == 20 and await running(repo) == 20
    jobs, _, wait_s, *_ = await repo.claim_limited("a", 10, CAPABILITIES, "d0", 60)
    assert jobs == [] and wait_s is not None and wait_s > 100  # the group's token is far off


async def test_the_queues_of_a_group_share_its_inflight_cap(repo: JobRepository) -> None:
    await setup(repo, (None, None, 10), {"a": (UNLIMITED, 0, 100), "b": (UNLIMITED, 0, 100)})
    for _ in range(3):
        await asyncio.gather(*(claim(repo, q, 8, f"d{i}") for i in range(3) for q in ("a", "b")))
        assert await running(repo) == 10
    await complete_some(repo, "a", 4)  # four free slots, for either queue
    await asyncio.gather(*(claim(repo, "b", 8, f"d{i}") for i in range(3)))
    assert await running(repo) == 10 and await running(repo, "b") >= 4


async def test_a_queue_keeps_its_own_limits_in_a_group(repo: JobRepository) -> None:
    await setup(repo, (None, None, 50), {"a": ((None, None, 3), 0, 100), "b": (UNLIMITED, 0, 100)})
    assert await claim(repo, "a", 20) == 3  # its own cap, though the group has room
    assert await claim(repo, "b", 100) == 47  # the group's cap: 50 less a's 3


async def test_the_better_priority_gets_a_short_budget_first(repo: JobRepository) -> None:
    await setup(repo, (None, None, 10), {"hi": (UNLIMITED, -10, 100), "lo": (UNLIMITED, 10, 100)})
    jobs, _, wait_s, *_ = await repo.claim_limited("lo", 10, CAPABILITIES, "d0", 60)
    assert jobs == [] and wait_s is not None and wait_s <= 0.05  # left for "hi": look again soon
    assert await claim(repo, "hi", 10) == 10
    await complete_some(repo, "hi", 10)
    await repo.pool.execute(  # "hi" has only 3 ready jobs left: "lo" gets the other 7
        "UPDATE dispatcher.jobs SET state = 'cancelled', finished_at = now()"
        " WHERE queue = 'hi' AND state = 'ready'"
        " AND id NOT IN (SELECT id FROM dispatcher.jobs WHERE queue = 'hi'"
        "                 AND state = 'ready' ORDER BY id LIMIT 3)"
    )
    assert await claim(repo, "lo", 10) == 7
    assert await claim(repo, "hi", 10) == 3


async def test_a_better_queue_at_its_own_limits_or_paused_reserves_nothing(
    repo: JobRepository,
) -> None:
    await setup(
        repo, (None, None, 10), {"hi": ((None, None, 2), -10, 100), "lo": (UNLIMITED, 10, 100)}
    )
    assert await claim(repo, "hi", 10) == 2  # "hi" is at its own cap now
    assert await claim(repo, "lo", 10) == 8
    await complete_some(repo, "lo", 8)
    await complete_some(repo, "hi", 2)
    await repo.set_queue_paused("hi", True)
    assert await claim(repo, "lo", 10) == 10


async def test_tokens_a_claim_did_not_use_go_back_to_the_group(repo: JobRepository) -> None:
    await setup(repo, (0.001, 10, None), {"a": (UNLIMITED, 0, 2), "b": (UNLIMITED, 0, 100)})
    assert await claim(repo, "a", 10) == 2  # granted 10, started 2: 8 go back to the group
    assert await claim(repo, "b", 100) == 8


async def test_joining_a_group_drops_the_permits_parked_outside_it(repo: JobRepository) -> None:
    await repo.sync_registry(
        {"a": (3, 3600)}, {"work": ("python", 1)}, limits={"a": (None, None, 1000)}
    )
    await add_jobs(repo, "a", 300)
    assert await claim(repo, "a", 10) == 10
    assert await parked(repo, "a") == 80
    await repo.sync_registry(
        {"a": (3, 3600)},
        {"work": ("python", 1)},
        limits={"a": (None, None, 1000)},
        groups={"g": (None, None, 15)},
        membership={"a": ("g", 0)},
    )
    assert await parked(repo, "a") == 0
    await asyncio.gather(*(claim(repo, "a", 50, f"d{i}") for i in range(4)))
    assert await running(repo) == 15  # the group's cap, no permit slipped past it


async def test_lowering_a_groups_burst_caps_its_bucket_at_once(repo: JobRepository) -> None:
    await setup(repo, (0.001, 40, None), {"a": (UNLIMITED, 0, 100)})
    await repo.sync_registry(
        {"a": (3, 3600)},
        {"work": ("python", 1)},
        groups={"g": (0.001, 5, None)},
        membership={"a": ("g", 0)},
    )
    assert await claim(repo, "a", 100) == 5


async def test_leaving_a_group_frees_the_queue_and_drops_the_group(repo: JobRepository) -> None:
    await setup(repo, (None, None, 1), {"a": (UNLIMITED, 0, 10)})
    await repo.sync_registry({"a": (3, 3600)}, {"work": ("python", 1)})
    assert await claim(repo, "a", 10) == 10
    assert await repo.pool.fetchval("SELECT count(*) FROM dispatcher.limit_groups") == 0


async def test_bad_group_values_are_refused_at_the_sql_door(pool: asyncpg.Pool) -> None:
    with pytest.raises(asyncpg.ForeignKeyViolationError, match="queues_limit_group_exists"):
        await pool.execute(
            "UPDATE dispatcher.queues SET limit_group = 'nope' WHERE name = 'default'"
        )
    with pytest.raises(asyncpg.CheckViolationError, match="queues_group_priority_range"):
        await pool.execute(
            "UPDATE dispatcher.queues SET group_priority = 500 WHERE name = 'default'"
        )
    with pytest.raises(asyncpg.CheckViolationError, match="limit_groups_rate_needs_a_burst"):
        await pool.execute("INSERT INTO dispatcher.limit_groups (name, rate_per_s) VALUES ('x', 5)")
    row = await pool.fetchrow(
        "SELECT limit_group, group_priority FROM dispatcher.queues WHERE name = 'default'"
    )
    assert tuple(row) == (None, 0)
    assert await pool.fetchval("SELECT count(*) FROM dispatcher.limit_groups") == 0
