"""Bulk actions on jobs (dispatcher.operator.bulk) through the operator service on real
PostgreSQL: each action by ids and by filter moves exactly the jobs in the states its one-job
action accepts and counts the others per state with the reason; a dry run changes nothing;
batches commit one by one; the same key never applies twice and resumes a walk cut off; two
walks with other keys over the same jobs never move a job twice; one audit line each."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from dispatcher.config.settings import Settings
from dispatcher.db.bulk import BulkStore, Selection
from dispatcher.db.jobs import JobRepository
from dispatcher.db.pool import create_pool
from dispatcher.model import JobFilter
from dispatcher.operator import bulk
from dispatcher.operator.audit import Actor
from dispatcher.operator.bulk import BulkRequest
from dispatcher.operator.errors import Conflict, Invalid
from dispatcher.operator.service import Operator

OPS = Actor("oncall", "api")
STATES = ("scheduled", "ready", "running", "succeeded", "dead", "cancelled", "discarded")


async def seed(pool: asyncpg.Pool, n: int, states: tuple[str, ...] = STATES) -> list[int]:
    """`n` jobs of queue 'default', tenant 't' + (g % 2), in `states` in turn; their ids."""
    rows = await pool.fetch(
        """
        INSERT INTO dispatcher.jobs (key, request_hash, queue, tenant, handler, payload, state,
               due_at, attempt, max_attempts, max_retry_age_s, budget_started_at, finished_at,
               dead_reason, lease_owner, lease_expires_at)
        SELECT 'b-' || g, md5(g::text), 'default', 't' || (g % 2), 'noop', '{}'::jsonb, s,
               CASE WHEN s = 'scheduled' THEN now() + interval '1 day' ELSE now() END,
               CASE WHEN s IN ('dead', 'running', 'succeeded') THEN 1 ELSE 0 END, 10, 86400,
               now(), CASE WHEN s IN ('succeeded', 'dead', 'cancelled', 'discarded')
                           THEN now() END,
               CASE WHEN s IN ('dead', 'discarded') THEN 'max_attempts' END,
               CASE WHEN s = 'running' THEN 'elsewhere' END,
               CASE WHEN s = 'running' THEN now() + interval '1 hour' END
          FROM generate_series(1, $1) g
          CROSS JOIN LATERAL (SELECT ($2::text[])[1 + (g - 1) % cardinality($2::text[])] AS s) x
        RETURNING id""",
        n,
        list(states),
    )
    await pool.execute(
        "INSERT INTO dispatcher.queues (name, max_attempts, max_retry_age_s) "
        "VALUES ('default', 10, 86400) ON CONFLICT DO NOTHING"
    )
    return [r["id"] for r in rows]


async def states(pool: asyncpg.Pool) -> Counter[str]:
    return Counter(r["state"] for r in await pool.fetch("SELECT state FROM dispatcher.jobs"))


@pytest.fixture
def service(repo: JobRepository) -> Operator:
    return Operator(repo, Settings.model_validate({"queues": {"default": {}}}))


def by_filter(action: str, **given: object) -> BulkRequest:
    return BulkRequest(action, Selection(filters=JobFilter(**given)))  # type: ignore[arg-type]


def audit(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "dispatcher.operator" and
            r.getMessage().startswith("operator action ")]  # fmt: skip


@pytest.mark.parametrize(
    ("action", "moved_from", "became"),
    [
        ("retry", ("dead", "cancelled", "discarded"), {"ready": 3}),
        ("cancel", ("scheduled", "ready", "running"), {"cancelled": 2, "running": 1}),
        ("discard", ("dead",), {"discarded": 1}),
        ("reschedule", ("scheduled", "ready"), {"ready": 2}),
        ("run_now", ("scheduled",), {"ready": 1}),
    ],
)
async def test_each_action_by_ids_moves_exactly_its_states(
    pool: asyncpg.Pool, service: Operator, action: str, moved_from: tuple[str, ...],
    became: dict[str, int],
) -> None:  # fmt: skip
    ids = await seed(pool, 7)  # one job in each state
    before = {
        r["id"]: r["state"] for r in await pool.fetch("SELECT id, state FROM dispatcher.jobs")
    }
    request = BulkRequest(action, Selection(ids=(*ids, 999_999)))

    result = await service.bulk(OPS, request)

    assert (result["matched"], result["applied"], result["busy"]) == (7, len(moved_from), 0)
    assert result["became"] == became and result["not_found"] == 1
    skipped = {s for s in STATES if s not in moved_from}
    assert set(result["skipped"]) == skipped
    rule = bulk.TRANSITIONS[action].rule
    assert all(v["count"] == 1 and v["reason"].startswith(rule) for v in result["skipped"].values())
    after = {r["id"]: r for r in await pool.fetch("SELECT * FROM dispatcher.jobs")}
    for job_id, state in before.items():
        if state in skipped:
            assert after[job_id]["state"] == state  # untouched
    if action == "retry":
        assert all(after[i]["attempt"] == 0 for i in ids if before[i] in moved_from)
    if action == "cancel":
        running = next(i for i in ids if before[i] == "running")
        assert after[running]["cancel_requested"] is True


async def test_by_filter_a_dry_run_changes_nothing_then_the_action_matches_it(
    pool: asyncpg.Pool, service: Operator
) -> None:
    await seed(pool, 70)  # 10 in each state, tenants t0 and t1
    before = await states(pool)

    selection = Selection(filters=JobFilter(tenant="t1"))
    dry = await service.bulk(OPS, BulkRequest("retry", selection, dry_run=True))
    assert await states(pool) == before
    assert (dry["matched"], dry["would_apply"]) == (35, 15)
    assert dry["skipped"]["running"] == {"count": 5, "reason": bulk.TRANSITIONS["retry"].rule}
    assert len(dry["sample"]) == bulk.SAMPLE

    done = await service.bulk(OPS, by_filter("retry", tenant="t1"))
    assert (done["matched"], done["applied"], done["became"]) == (35, 15, {"ready": 15})
    assert {s: v["count"] for s, v in done["skipped"].items()} == {
        s: n["count"] for s, n in dry["skipped"].items()
    }
    after = await states(pool)
    assert after["ready"] == before["ready"] + 15 and after["dead"] == before["dead"] - 5


async def test_batches_commit_one_by_one_and_the_walk_ends(
    pool: asyncpg.Pool, repo: JobRepository
) -> None:
    await seed(pool, 5000, ("dead",))
    store = BulkStore(pool)
    request = by_filter("discard", state="dead")

    result = await bulk.apply(store, request, "oncall", batch=500)

    assert (result["applied"], result["batches"], result["busy"]) == (5000, 10, 0)
    assert await states(pool) == Counter({"discarded": 5000})
    again = await bulk.apply(store, request, "oncall", batch=500)  # a new key: nothing left
    assert (again["matched"], again["applied"]) == (0, 0)


async def test_the_same_key_never_applies_twice_and_resumes_a_walk_cut_off(
    pool: asyncpg.Pool, service: Operator, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dispatcher.operator")
    await seed(pool, 1200, ("dead",))
    store = BulkStore(pool)
    request = BulkRequest("retry", Selection(filters=JobFilter(state="dead")), key="k-1")
    # cut off after two batches: the third batch's move fails
    real_move = bulk.Walker.move
    calls = 0

    async def failing(self: bulk.Walker, move: bulk.Move) -> list[dict[str, object]]:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise RuntimeError("connection lost")
        return await real_move(self, move)

    bulk.Walker.move = failing  # type: ignore[method-assign]
    try:
        with pytest.raises(RuntimeError):
            await bulk.apply(store, request, "oncall", batch=500)
    finally:
        bulk.Walker.move = real_move  # type: ignore[method-assign]
    assert (await states(pool))["ready"] == 1000  # two batches committed, not the third

    resumed = await service.bulk(OPS, request)
    assert (resumed["applied"], resumed["batches"], resumed["replayed"]) == (1200, 3, False)
    assert await states(pool) == Counter({"ready": 1200})

    # the jobs die again; the same key changes nothing more and answers what it did
    await pool.execute("UPDATE dispatcher.job_state SET state = 'dead', finished_at = now()")
    replay = await service.bulk(OPS, request)
    assert replay["replayed"] is True and replay["applied"] == 1200
    assert await states(pool) == Counter({"dead": 1200})
    with pytest.raises(Conflict, match="names another bulk action"):
        await service.bulk(OPS, BulkRequest("discard", request.selection, key="k-1"))
    assert audit(caplog) == [
        "operator action bulk retry jobs matching state=dead key 'k-1' by 'oncall' (api): "
        "applied 1200 of 1200 (bulk_id 'k-1')",
        "operator action bulk retry jobs matching state=dead key 'k-1' by 'oncall' (api): "
        "applied 1200 of 1200 (bulk_id 'k-1', replayed)",
        "operator action bulk discard jobs matching state=dead key 'k-1' by 'oncall' (api): "
        "refused: the key 'k-1' names another bulk action (retry of another selection); use "
        "a new key",
    ]


async def test_two_walks_over_the_same_jobs_never_move_one_twice(
    pool: asyncpg.Pool, db_url: str
) -> None:
    await seed(pool, 3000, ("dead",))
    await pool.execute("UPDATE dispatcher.job_state SET attempt = 7")
    other = await create_pool(db_url, size=2, min_size=1)  # another daemon's pool
    try:
        request = by_filter("retry", state="dead")
        first, second = await asyncio.gather(
            bulk.apply(BulkStore(pool), request, "a", batch=100),
            bulk.apply(BulkStore(other), request, "b", batch=100),
        )
    finally:
        await other.close()
    # every job moved once, by one walk or the other, never by both (a retried job is ready,
    # which a retry does not take; one the other walk holds is busy), and none is left dead
    assert first["applied"] + second["applied"] == 3000
    assert await states(pool) == Counter({"ready": 3000})


async def test_invalid_requests_change_nothing(pool: asyncpg.Pool, service: Operator) -> None:
    ids = await seed(pool, 7)
    before = await states(pool)
    with pytest.raises(Invalid, match="unknown action 'explode'"):
        await service.bulk(OPS, BulkRequest("explode", Selection(ids=tuple(ids))))
    with pytest.raises(Invalid, match="ids: from 1 to 1000 job ids"):
        await service.bulk(OPS, BulkRequest("retry", Selection(ids=tuple(range(1, 1002)))))
    with pytest.raises(Invalid, match=r"filter\.queue: unknown queue 'nope'"):
        await service.bulk(OPS, by_filter("cancel", queue="nope"))
    past = datetime.now(UTC) - timedelta(days=2)
    with pytest.raises(Invalid, match=r"due_at: .* in the past"):
        await service.bulk(OPS, BulkRequest("reschedule", Selection(ids=tuple(ids)), due_at=past))
    with pytest.raises(Invalid, match="only a reschedule takes a due time"):
        later = datetime.now(UTC) + timedelta(days=2)
        await service.bulk(OPS, BulkRequest("retry", Selection(ids=tuple(ids)), due_at=later))
    assert await states(pool) == before


async def test_one_key_walked_by_two_requests_at_once_runs_once(
    pool: asyncpg.Pool, db_url: str
) -> None:
    await seed(pool, 3000, ("dead",))
    other = await create_pool(db_url, size=2, min_size=1)  # another daemon's pool
    request = BulkRequest("retry", Selection(filters=JobFilter(state="dead")), key="once")
    try:
        outcomes = await asyncio.gather(
            bulk.apply(BulkStore(pool), request, "a", batch=100),
            bulk.apply(BulkStore(other), request, "b", batch=100),
            return_exceptions=True,
        )
    finally:
        await other.close()
    done = [o for o in outcomes if isinstance(o, dict)]
    refused = [o for o in outcomes if isinstance(o, Conflict)]
    assert len(done) + len(refused) == 2 and done, outcomes
    assert all("is running now in another request" in str(c) for c in refused)
    # the one that ran took every job: the other stopped before it locked any (none busy)
    assert [(d["applied"], d["busy"]) for d in done if not d["replayed"]] == [(3000, 0)]
    # the record counts every job once, and every job moved once
    counts = await pool.fetchval("SELECT counts FROM dispatcher.bulk_actions WHERE key = 'once'")
    assert (counts["applied"], counts["matched"]) == (3000, 3000), counts
    assert await states(pool) == Counter({"ready": 3000})
    again = await bulk.apply(BulkStore(pool), request, "a", batch=100)
    assert (again["replayed"], again["applied"]) == (True, 3000)
