"""The in-process claim's order (db/queries.sql claim_ready, migration 023 claim_pick): the
lowest priority value first; within one priority, tenants take turns, every tenant reached
whatever their number; within a tenant, the earliest due first.

The defect: the claim walked only the first 1,000 tenants by name. With 1,100 tenants holding
10 ready jobs each and one more tenant ('zzz-last') holding one, that job started 7,227th of
11,001; round-robin starts it about 1,100th.
"""

from __future__ import annotations

import asyncpg
import pytest

from dispatcher.db.jobs import JobRepository

CAPS = ["noop:1"]
BATCH = 500


@pytest.fixture
async def noop(pool: asyncpg.Pool) -> asyncpg.Pool:
    await pool.execute("INSERT INTO dispatcher.handlers (name, kind) VALUES ('noop', 'python')")
    return pool


async def enqueue_spread(
    pool: asyncpg.Pool, prefix: str, tenants: str, per_tenant: int, priority: str = "0"
) -> None:
    """One enqueue_many: `per_tenant` ready jobs for each tenant of the SQL set `tenants`
    (a column `t`), at SQL `priority` (may use `t` and `n`, the job's number in its tenant)."""
    await pool.execute(f"""
        WITH items AS (
            SELECT t, n, {priority} AS p FROM ({tenants}) ts(t), generate_series(1, {per_tenant}) n
        )
        SELECT count(*) FROM dispatcher.enqueue_many(
               (SELECT array_agg('{prefix}-' || t || '-' || n ORDER BY t, n) FROM items),
               (SELECT array_agg('noop'::text) FROM items),
               (SELECT array_agg('{{}}'::jsonb) FROM items),
               tenants => (SELECT array_agg(t ORDER BY t, n) FROM items),
               priorities => (SELECT array_agg(p ORDER BY t, n) FROM items))""")


async def drain_order(repo: JobRepository, batch: int = BATCH) -> list[str]:
    """Claim until nothing is left; the keys in the order they started."""
    started: list[str] = []
    while True:
        jobs, _ = await repo.claim("default", batch, CAPS, "owner", 600.0)
        if not jobs:
            return started
        started += [j.key for j in jobs]


async def test_the_last_of_1101_tenants_starts_within_one_turn_of_the_others(
    noop: asyncpg.Pool, repo: JobRepository
) -> None:
    tenants = "SELECT 't' || lpad(g::text, 4, '0') FROM generate_series(1, 1100) g"
    await enqueue_spread(noop, "many", tenants, 10)
    await enqueue_spread(noop, "last", "SELECT 'zzz-last'", 1)
    order = await drain_order(repo)
    assert len(order) == 11_001
    position = order.index("last-zzz-last-1") + 1
    # one turn of the 1,100 others, then its own (the defect: 7,227th)
    assert position <= 1_101, position


async def test_no_tenant_waits_more_than_one_turn_of_the_others(
    noop: asyncpg.Pool, repo: JobRepository
) -> None:
    tenants = "SELECT 't' || lpad(g::text, 4, '0') FROM generate_series(1, 1200) g"
    await enqueue_spread(noop, "r", tenants, 3)
    order = await drain_order(repo, batch=70)
    tenant_of = [key.split("-")[1] for key in order]
    last_seen: dict[str, int] = {}
    for i, tenant in enumerate(tenant_of):
        if tenant in last_seen:
            # between two starts of one tenant, every other tenant starts about once
            assert i - last_seen[tenant] <= 1_200, (tenant, last_seen[tenant], i)
        last_seen[tenant] = i
    first_round = tenant_of[:1_200]
    assert len(set(first_round)) == 1_200  # every tenant once before any twice


async def test_lowest_priority_first_then_tenants_in_turn_then_earliest_due(
    noop: asyncpg.Pool, repo: JobRepository
) -> None:
    # tenant a: 6 jobs at priority 5; tenant b: 2 at 5 and 2 at -20; tenant c: 1 at 100
    await enqueue_spread(noop, "x", "SELECT 'a'", 6, "5")
    await enqueue_spread(noop, "x", "SELECT 'b'", 4, "CASE WHEN n <= 2 THEN -20 ELSE 5 END")
    await enqueue_spread(noop, "x", "SELECT 'c'", 1, "100")
    # b-4 is due earlier than b-3 (both ready): earliest due first within the tenant
    await noop.execute(
        "UPDATE dispatcher.job_state SET due_at = due_at - interval '1 minute' WHERE id ="
        " (SELECT id FROM dispatcher.intents WHERE key = 'x-b-4')"
    )
    order = await drain_order(repo, batch=3)
    # The first claim takes b's two jobs at -20 and stops at the end of that priority (one
    # tenant's: the plain case, 10_claim_ready.sql); the turns at 5 start with the next claim.
    assert order == [
        "x-b-1", "x-b-2",  # priority -20
        "x-a-1", "x-b-4", "x-a-2",  # priority 5: turns (share 2), b's earliest due first
        "x-a-3", "x-b-3", "x-a-4",  # the next claim from after b, its cursor
        "x-a-5", "x-a-6",
        "x-c-1",  # priority 100 last
    ]  # fmt: skip


async def test_a_priority_is_taken_whole_before_the_next_even_when_its_tenants_are_uneven(
    noop: asyncpg.Pool, repo: JobRepository
) -> None:
    """Equal shares per tenant would leave most of the urgent tenant's jobs for later claims
    while the claim filled up with less urgent ones."""
    await enqueue_spread(noop, "u", "SELECT 'big'", 400, "-10")
    await enqueue_spread(noop, "u", "SELECT unnest(ARRAY['s1', 's2', 's3'])", 1, "-10")
    await enqueue_spread(noop, "l", "SELECT 't' || g FROM generate_series(1, 50) g", 10)
    jobs, _ = await repo.claim("default", 300, CAPS, "owner", 600.0)
    keys = [j.key for j in jobs]
    assert len(keys) == 300
    assert all(k.startswith("u-") for k in keys), [k for k in keys if not k.startswith("u-")]
    assert {"u-s1-1", "u-s2-1", "u-s3-1"} <= set(keys)


async def test_ten_thousand_tenants_beside_one_with_a_hundred_thousand_jobs(
    noop: asyncpg.Pool, repo: JobRepository
) -> None:
    """Each of 10,000 small tenants starts within one turn of all tenants, and the big one
    keeps its turn every round (one job a round, not all of each claim)."""
    await enqueue_spread(noop, "big", "SELECT 'big'", 100_000)
    tenants = "SELECT 's' || lpad(g::text, 5, '0') FROM generate_series(1, 10000) g"
    await enqueue_spread(noop, "small", tenants, 1)
    await noop.execute("VACUUM ANALYZE dispatcher.intents, dispatcher.job_state")
    started: list[str] = []
    while len(started) < 10_001 + 2 * BATCH:
        jobs, _ = await repo.claim("default", BATCH, CAPS, "owner", 600.0)
        assert jobs
        started += [j.key for j in jobs]
    first_turn = started[:10_001]
    small = [k for k in first_turn if k.startswith("small-")]
    assert len(small) == 10_000  # every small tenant within the first turn of all 10,001
    big = [k for k in first_turn if k.startswith("big-")]
    assert len(big) == 1  # and the big one had its turn in it too, once
    # the big tenant's jobs start earliest due first
    rest = [int(k.rsplit("-", 1)[1]) for k in started if k.startswith("big-")]
    assert rest == sorted(rest)


async def test_an_operator_raises_a_waiting_jobs_priority_through_the_view(
    noop: asyncpg.Pool, repo: JobRepository
) -> None:
    await enqueue_spread(noop, "w", "SELECT 'a'", 3)
    await noop.execute("UPDATE dispatcher.intake_settings SET ready_outbox = true")
    await noop.execute(
        "INSERT INTO dispatcher.outbox (job_id, queue, tenant, capability)"
        " SELECT id, queue, tenant, 'noop:1' FROM dispatcher.job_state"
    )
    updated = await noop.execute("UPDATE dispatcher.jobs SET priority = -20 WHERE key = 'w-a-3'")
    assert updated == "UPDATE 1"
    # the state row (which the claim reads), the intent and the relay's row all follow
    row = await noop.fetchrow(
        "SELECT s.priority, i.priority AS ip, o.priority AS op FROM dispatcher.intents i"
        " JOIN dispatcher.job_state s USING (id) JOIN dispatcher.outbox o ON o.job_id = i.id"
        " WHERE i.key = 'w-a-3'"
    )
    assert tuple(row) == (-20, -20, -20)
    assert await drain_order(repo, batch=1) == ["w-a-3", "w-a-1", "w-a-2"]
