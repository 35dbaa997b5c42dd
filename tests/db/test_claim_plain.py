"""The claim's plain case (db/functions/10_claim_ready.sql): a queue with no key limits and no
limit group whose ready jobs are all of one tenant at one priority is claimed in fewer
statements, and a queue with nothing ready answers without taking permits. The plain case must
claim what the full claim would; each test below puts a queue just inside or just outside it.
"""

from __future__ import annotations

from datetime import timedelta

import asyncpg

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


# The plain case's one job (the first ready job, when the next is another tenant's or
# priority's, or there is none) is claimed in statements of its own: each test below holds it
# to what the walk's statement does for the same job.

_CLAIM_ROWS = (
    "SELECT * FROM dispatcher.claim_ready('default', $1, $2, 'd0', 60, $3, $4, NULL, NULL)"
)
_STATE_ROW = (
    "SELECT s.state, s.attempt, s.lease_owner, s.lease_expires_at - s.started_at AS lease,"
    "       s.started_at = now() AS started_now, s.dead_reason, s.last_error, s.finished_at"
    "  FROM dispatcher.job_state s JOIN dispatcher.intents i ON i.id = s.id WHERE i.key = $1"
)


FINISH_READY = "UPDATE dispatcher.job_state SET state = 'succeeded', finished_at = now()"


def rich(key: str) -> NewJob:
    """A job with every column the claim returns set to something of its own."""
    return NewJob(
        key=key,
        handler="work",
        payload={"n": 1, "s": "é"},
        tenant="acme",
        max_attempts=7,
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        timeout_s=12.5,
    )


async def claimed_alone_and_walked(repo: JobRepository) -> tuple[list, list]:
    """The rows of one job claimed alone (the one-job case) and of the same job claimed with
    a second job of its tenant behind it (the walk), and their state rows, in one transaction
    each (now() is the claim's)."""
    await setup(repo, [rich("alone")])
    results = []
    for keys in (["alone"], ["walked", "behind"]):
        await repo.enqueue_many([rich(k) for k in keys if k != "alone"])
        async with repo.pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(_CLAIM_ROWS, 10, CAPS, 2**62, False)
            state = await conn.fetchrow(_STATE_ROW, keys[0])
        results.append((rows, state))
    return results[0], results[1]


def job_columns(row: asyncpg.Record) -> dict:
    """A job row's columns but its id, key and times (each job's own)."""
    skip = {"id", "key", "due_at", "due_to_start_s"}
    return {k: v for k, v in dict(row).items() if k not in skip}


async def test_the_one_job_is_claimed_as_the_walk_claims_it(repo: JobRepository) -> None:
    (alone, alone_state), (walked, walked_state) = await claimed_alone_and_walked(repo)
    assert [r["key"] for r in alone] == ["alone", None]
    assert [r["key"] for r in walked] == ["walked", "behind", None]
    assert job_columns(alone[0]) == job_columns(walked[0])
    assert alone[0]["attempt"] == 1 and alone[0]["max_attempts"] == 7
    assert 0 <= alone[0]["due_to_start_s"] < 60
    assert dict(alone_state) == dict(walked_state)
    assert alone_state["state"] == "running" and alone_state["lease"] == timedelta(seconds=60)
    assert alone_state["started_now"]
    # the markers: one taken, the cursor its tenant's, and nothing left (drained)
    marker = dict(alone[-1])
    assert (marker["taken_count"], marker["held_back"], marker["expired_count"]) == (1, False, 0)
    assert (marker["cursor_priority"], marker["cursor_tenant"]) == (0, "acme")
    assert marker["drained"] and not marker["key_throttled"]
    assert walked[-1]["drained"]  # the walk took both: fewer than asked, nothing else ready


async def test_the_one_job_expired_is_ended_and_draws_no_permit(repo: JobRepository) -> None:
    await setup(repo, [job("gone")], limits=(1000.0, 100, 1000))
    await repo.pool.execute(
        "UPDATE dispatcher.job_state SET expires_at = now() - interval '1 second'"
    )
    await repo.claim_limited("default", 10, ["none:1"], "d0", 60)  # parks a slot, takes nothing
    parked = await repo.pool.fetchval("SELECT sum(n) FROM dispatcher.claim_permits")
    assert parked > 0
    claimed = await repo.claim_limited("default", 10, CAPS, "d0", 60)
    assert (claimed.jobs, claimed.consumed, claimed.expired) == ([], 1, 1)
    assert claimed.drained and not claimed.held_back
    gone = await repo.pool.fetchrow(_STATE_ROW, "gone")
    assert (gone["state"], gone["dead_reason"], gone["lease_owner"]) == ("dead", "expired", None)
    assert gone["last_error"].startswith("expired at ") and gone["finished_at"] is not None
    assert await repo.pool.fetchval("SELECT sum(n) FROM dispatcher.claim_permits") == parked


async def test_the_one_job_draws_one_permit_and_waits_for_a_token(repo: JobRepository) -> None:
    await setup(repo, [job("a-1")], limits=(1000.0, 100, 1000))
    await repo.claim_limited("default", 10, ["none:1"], "d0", 60)  # parks a slot
    parked = await repo.pool.fetchval("SELECT sum(n) FROM dispatcher.claim_permits")
    assert await claim(repo, 10) == ["a-1"]
    assert await repo.pool.fetchval("SELECT sum(n) FROM dispatcher.claim_permits") == parked - 1
    # a bucket of one token (a change of limits fills it): the next job takes it, and the one
    # after is not picked; the loop is told when to look again
    await repo.pool.execute(
        "UPDATE dispatcher.queues SET rate_per_s = 0.001, burst = 1, permits_parked = 0"
        " WHERE name = 'default'"
    )
    await repo.pool.execute("DELETE FROM dispatcher.claim_permits")
    await repo.enqueue_many([job("a-2")])
    assert await claim(repo, 10) == ["a-2"]
    await repo.enqueue_many([job("a-3")])
    held = await repo.claim_limited("default", 10, CAPS, "d0", 60)
    assert held.jobs == [] and held.wait_s is not None and held.wait_s > 100
    assert not held.drained  # a job is ready: only the limit holds it back


async def test_the_one_job_over_the_budget_is_held_back_unless_alone(repo: JobRepository) -> None:
    big = NewJob(key="big", handler="work", payload={"blob": "x" * 2_000}, tenant="acme")
    await setup(repo, [big])
    rows = await repo.pool.fetch(_CLAIM_ROWS, 10, CAPS, 1_000, False)
    assert [r["key"] for r in rows] == [None]
    assert rows[0]["held_back"] and not rows[0]["drained"] and rows[0]["taken_count"] == 0
    assert (await repo.pool.fetchrow(_STATE_ROW, "big"))["state"] == "ready"
    rows = await repo.pool.fetch(_CLAIM_ROWS, 10, CAPS, 1_000, True)  # the daemon holds nothing
    assert [r["key"] for r in rows] == ["big", None] and rows[0]["size_bytes"] > 2_000


async def test_the_one_job_locked_by_another_claim_is_passed_over(repo: JobRepository) -> None:
    await setup(repo, [job("a-1")])
    async with repo.pool.acquire() as other, other.transaction():
        await other.execute("SELECT 1 FROM dispatcher.job_state WHERE state = 'ready' FOR UPDATE")
        passed = await repo.claim_limited("default", 10, CAPS, "d0", 60)
        assert passed.jobs == [] and passed.consumed == 0  # not waited for
    assert await claim(repo, 10) == ["a-1"]  # the other let go


async def test_the_one_job_runs_only_where_the_walk_would_take_it(repo: JobRepository) -> None:
    """Not this worker's handler, or moved ahead of its due time by the due-scan: it stays
    ready; one job each of two tenants: the turns."""
    other = NewJob(key="other-1", handler="other", payload={}, tenant="acme")
    await setup(repo, [other])
    claimed = await repo.claim_limited("default", 10, CAPS, "d0", 60)
    assert claimed.jobs == [] and claimed.drained
    await repo.pool.execute(FINISH_READY)
    await repo.enqueue_many([job("later")])
    await repo.pool.execute(
        "UPDATE dispatcher.job_state SET due_at = now() + interval '1 minute' WHERE state = 'ready'"
    )
    assert await claim(repo, 10) == []
    assert (await repo.pool.fetchrow(_STATE_ROW, "later"))["state"] == "ready"
    await repo.pool.execute(FINISH_READY)
    await repo.enqueue_many([job("a-1"), job("b-1", tenant="bravo")])
    called = await functions_called(repo, 2)
    assert called["claim_pick"] == 1  # two tenants' one job each: the turns
