"""The claim's plain case (db/functions/10_claim_ready.sql): a queue with no key limits and no
limit group whose ready jobs are all of one tenant at one priority is claimed in fewer
statements, and a queue with nothing ready answers without taking permits. The plain case must
claim what the full claim would; each test below puts a queue just inside or just outside it.
"""

from __future__ import annotations

from dispatcher.db.jobs import JobRepository
from dispatcher.db.registry import Limits
from dispatcher.model import ByteGrant, NewJob

CAPS = ["work:1"]
NO_LIMITS: Limits = (None, None, None)


async def setup(
    repo: JobRepository,
    jobs: list[NewJob],
    limits: Limits = NO_LIMITS,
    key_limits: Limits = NO_LIMITS,
) -> None:
    await repo.sync_registry(
        {"default": (3, 3600)},
        {"work": ("python", 1), "other": ("python", 1)},
        limits={"default": limits},
        key_limits={"default": key_limits},
    )
    for job in jobs:  # one statement each: due times in this order
        await repo.enqueue_many([job])


def job(key: str, tenant: str = "acme", priority: int = 0) -> NewJob:
    return NewJob(key=key, handler="work", payload={}, tenant=tenant, priority=priority)


async def claim(repo: JobRepository, n: int, grant: ByteGrant | None = None) -> list[str]:
    if grant is None:
        jobs, _ = await repo.claim("default", n, CAPS, "d0", 60)
    else:
        jobs, _ = await repo.claim("default", n, CAPS, "d0", 60, grant)
    return [j.key for j in jobs]


async def test_one_tenant_is_claimed_earliest_due_first_and_only_what_the_worker_runs(
    repo: JobRepository,
) -> None:
    other = NewJob(key="other-1", handler="other", payload={}, tenant="acme")
    await setup(repo, [job("a-1"), other, job("a-2"), job("a-3"), job("a-4")])
    assert await claim(repo, 2) == ["a-1", "a-2"]
    assert await claim(repo, 10) == ["a-3", "a-4"]
    # a job of a handler this worker does not run stays ready
    assert (
        await repo.pool.fetchval("SELECT state FROM dispatcher.jobs WHERE key = 'other-1'")
        == "ready"
    )
    assert await claim(repo, 10) == []


async def test_nothing_ready_takes_no_permit_and_no_token(repo: JobRepository) -> None:
    await setup(repo, [], limits=(100.0, 50, 1000))
    before = await repo.pool.fetchrow(
        "SELECT tokens, tokens_at, permits_parked FROM dispatcher.queues WHERE name = 'default'"
    )
    claimed = await repo.claim_limited("default", 10, CAPS, "d0", 60)
    assert (claimed.jobs, claimed.consumed, claimed.wait_s) == ([], 0, None)
    after = await repo.pool.fetchrow(
        "SELECT tokens, tokens_at, permits_parked FROM dispatcher.queues WHERE name = 'default'"
    )
    # the full claim refills the bucket and parks permits for the claims after it
    assert after == before
    assert await repo.pool.fetchval("SELECT count(*) FROM dispatcher.claim_permits") == 0


async def test_the_global_limits_still_bound_a_plain_claim(repo: JobRepository) -> None:
    await setup(repo, [job(f"a-{i}") for i in range(6)], limits=(None, None, 4))
    assert len(await claim(repo, 10)) == 4
    assert await claim(repo, 10) == []  # 4 running: the cap is full


async def test_a_second_tenant_brings_the_turns_back(repo: JobRepository) -> None:
    await setup(repo, [job("a-1"), job("a-2"), job("a-3"), job("b-1", tenant="bravo")])
    assert await claim(repo, 2) == ["a-1", "b-1"]


async def test_a_job_at_a_lower_priority_value_goes_first(repo: JobRepository) -> None:
    await setup(repo, [job("a-1"), job("a-2"), job("urgent", priority=-5)])
    assert await claim(repo, 1) == ["urgent"]
    assert await claim(repo, 1) == ["a-1"]


async def test_key_limits_hold_for_a_single_tenant(repo: JobRepository) -> None:
    await setup(repo, [job(f"a-{i}") for i in range(5)], key_limits=(None, None, 1))
    assert await claim(repo, 5) == ["a-0"]
    assert await claim(repo, 5) == []


async def test_a_key_override_holds_for_a_single_tenant(repo: JobRepository) -> None:
    await setup(repo, [job(f"a-{i}") for i in range(5)])
    await repo.pool.execute(
        "INSERT INTO dispatcher.key_limits (queue, key, max_inflight) VALUES ('default', 'acme', 2)"
    )
    assert await claim(repo, 5) == ["a-0", "a-1"]


async def test_a_paused_queue_with_one_tenant_offers_nothing(repo: JobRepository) -> None:
    await setup(repo, [job("a-1")])
    await repo.pool.execute(
        "UPDATE dispatcher.queues SET paused = true, paused_at = now() WHERE name = 'default'"
    )
    assert await claim(repo, 5) == []
    await repo.pool.execute(
        "UPDATE dispatcher.queues SET paused = false, paused_at = NULL WHERE name = 'default'"
    )
    assert await claim(repo, 5) == ["a-1"]


async def test_the_memory_budget_and_expiry_hold(repo: JobRepository) -> None:
    big = {"blob": "x" * 2_000}
    await setup(
        repo,
        [
            job("gone"),
            *(NewJob(key=f"big-{i}", handler="work", payload=big, tenant="acme") for i in range(3)),
        ],
    )
    await repo.pool.execute(
        "UPDATE dispatcher.job_state SET expires_at = now() - interval '1 second'"
        " WHERE id = (SELECT id FROM dispatcher.jobs WHERE key = 'gone')"
    )
    claimed = await repo.claim_limited("default", 10, CAPS, "d0", 60, ByteGrant(4_500))
    assert [j.key for j in claimed.jobs] == ["big-0", "big-1"]
    assert claimed.held_back and claimed.expired == 1
    assert not claimed.drained  # a job held back is still ready: the loop waits for bytes
    assert (
        await repo.pool.fetchval("SELECT dead_reason FROM dispatcher.jobs WHERE key = 'gone'")
        == "expired"
    )


_CALLS = (
    "SELECT p.proname, coalesce(pg_stat_get_xact_function_calls(p.oid), 0) AS calls"
    "  FROM pg_proc p WHERE p.pronamespace = 'dispatcher'::regnamespace"
    "   AND p.proname IN ('claim_pick', 'keys_at_limit', 'key_take', 'claim_grant')"
)


async def functions_called(repo: JobRepository, n: int) -> dict[str, int]:
    """Claim `n`; how often it called the turns', keys' and limits' functions (counted by the
    server; its counts not yet reported may hold earlier transactions', so the difference)."""
    async with repo.pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL track_functions = 'pl'")
        before = {r["proname"]: r["calls"] for r in await conn.fetch(_CALLS)}
        await conn.fetch(
            "SELECT * FROM dispatcher.claim_ready('default', $1, $2, 'd0', 60, $3, true,"
            " NULL, NULL)",
            n,
            CAPS,
            2**62,
        )
        after = {r["proname"]: r["calls"] for r in await conn.fetch(_CALLS)}
    return {name: after[name] - before[name] for name in after}


async def test_the_plain_case_runs_neither_turns_nor_keys(repo: JobRepository) -> None:
    await setup(repo, [job("a-1"), job("a-2")])
    assert await functions_called(repo, 1) == {
        "claim_grant": 1,
        "claim_pick": 0,
        "keys_at_limit": 0,
        "key_take": 0,
    }
    await repo.enqueue_many([job("b-1", tenant="bravo")])  # two tenants: the full claim
    called = await functions_called(repo, 1)
    assert called["claim_pick"] == 1 and called["key_take"] == 1
    await repo.pool.execute(
        "UPDATE dispatcher.job_state SET state = 'succeeded',"
        " finished_at = now(), lease_owner = NULL, lease_expires_at = NULL"
    )
    assert (await functions_called(repo, 1))["claim_grant"] == 0  # nothing ready: no grant


async def test_the_marker_says_drained_only_when_nothing_else_is_ready(
    repo: JobRepository,
) -> None:
    await setup(repo, [job("a-1"), job("a-2"), job("a-3")])
    assert not (await repo.claim_limited("default", 2, CAPS, "d0", 60)).drained  # one is left
    last = await repo.claim_limited("default", 2, CAPS, "d0", 60)
    assert [j.key for j in last.jobs] == ["a-3"] and last.drained  # fewer than granted
    assert (await repo.claim_limited("default", 2, CAPS, "d0", 60)).drained  # nothing ready
    # the full claim does not say so (its turns may have left work a share could not take)
    await repo.enqueue_many([job("b-1", tenant="bravo"), job("c-1", tenant="charlie")])
    full = await repo.claim_limited("default", 5, CAPS, "d0", 60)
    assert len(full.jobs) == 2 and not full.drained


async def test_a_job_of_a_handler_this_worker_does_not_run_leaves_it_drained(
    repo: JobRepository,
) -> None:
    other = NewJob(key="other-1", handler="other", payload={}, tenant="acme")
    await setup(repo, [job("a-1"), other])
    claimed = await repo.claim_limited("default", 5, CAPS, "d0", 60)
    assert [j.key for j in claimed.jobs] == ["a-1"] and claimed.drained


async def test_one_tenant_at_the_lowest_priority_is_the_plain_case_up_to_its_end(
    repo: JobRepository,
) -> None:
    """Priorities without tenants: the lowest priority's one tenant is claimed as the plain
    case; the claim stops at the end of that priority (strict order), and says nothing is left
    only when no other priority waits."""
    await setup(repo, [job("u-1", priority=-5), job("u-2", priority=-5), job("b-1", "bravo")])
    assert await functions_called(repo, 1) == {
        "claim_grant": 1,
        "claim_pick": 0,
        "keys_at_limit": 0,
        "key_take": 0,
    }
    urgent = await repo.claim_limited("default", 10, CAPS, "d0", 60)
    assert [j.key for j in urgent.jobs] == ["u-2"] and not urgent.drained  # bravo waits
    rest = await repo.claim_limited("default", 10, CAPS, "d0", 60)
    assert [j.key for j in rest.jobs] == ["b-1"] and rest.drained
    # two tenants at the lowest priority: the turns (the full claim)
    await repo.enqueue_many([job("x-1", "acme", -9), job("y-1", "bravo", -9)])
    assert (await functions_called(repo, 2))["claim_pick"] == 1
