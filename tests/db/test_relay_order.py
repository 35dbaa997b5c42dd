"""The RabbitMQ relay's order (db/relay.sql lease_outbox, migration 023 relay_pick): the relay
publishes in the order the in-process claim takes jobs (lowest priority value first, tenants in
turn, every tenant reached, oldest first), so the priority and the turns survive the broker,
which delivers a queue's messages in publishing order. The broker itself is in
tests/e2e/test_priorities.py."""

from __future__ import annotations

import asyncpg
import pytest

from dispatcher.db.jobs import JobRepository
from dispatcher.db.relay import RelayRepository
from tests.db.test_claim_order import enqueue_spread


@pytest.fixture
async def relay(pool: asyncpg.Pool) -> RelayRepository:
    await pool.execute("INSERT INTO dispatcher.handlers (name, kind) VALUES ('noop', 'python')")
    # a relay transport's database: every ready job gets an outbox row
    await pool.execute("UPDATE dispatcher.intake_settings SET ready_outbox = true")
    return RelayRepository(pool)


async def publish_all(relay: RelayRepository, batch: int) -> list[int]:
    """Lease batch after batch; the job ids in publishing order."""
    order: list[int] = []
    while leased := await relay.lease_outbox({"default": 1_000_000}, {"default": 100}, batch, "r1"):
        order += [r.job_id for r in leased]
    return order


async def keys_of(pool: asyncpg.Pool, ids: list[int]) -> list[str]:
    rows = await pool.fetch(
        "SELECT i.key FROM unnest($1::bigint[]) WITH ORDINALITY u(id, n)"
        " JOIN dispatcher.intents i ON i.id = u.id ORDER BY u.n",
        ids,
    )
    return [r["key"] for r in rows]


async def test_the_last_of_1101_tenants_is_published_within_one_turn(
    pool: asyncpg.Pool, relay: RelayRepository
) -> None:
    tenants = "SELECT 't' || lpad(g::text, 4, '0') FROM generate_series(1, 1100) g"
    await enqueue_spread(pool, "many", tenants, 10)
    await enqueue_spread(pool, "last", "SELECT 'zzz-last'", 1)
    order = await keys_of(pool, await publish_all(relay, 500))
    assert len(order) == 11_001
    assert order.index("last-zzz-last-1") + 1 <= 1_101


async def test_priority_then_turns_then_oldest_in_publishing_order(
    pool: asyncpg.Pool, relay: RelayRepository
) -> None:
    await enqueue_spread(pool, "x", "SELECT 'a'", 4, "5")
    await enqueue_spread(pool, "x", "SELECT 'b'", 4, "CASE WHEN n <= 2 THEN -20 ELSE 5 END")
    await enqueue_spread(pool, "x", "SELECT 'c'", 1, "100")
    order = await keys_of(pool, await publish_all(relay, 3))
    assert order == [
        "x-b-1", "x-b-2", "x-a-1", "x-b-3", "x-a-2", "x-b-4", "x-a-3", "x-a-4", "x-c-1",
    ]  # fmt: skip


async def test_a_job_made_ready_again_keeps_its_priority_in_the_outbox(
    pool: asyncpg.Pool, repo: JobRepository, relay: RelayRepository
) -> None:
    """Every statement that makes a job ready writes its outbox row with the job's priority
    (here the lease rescue; a row at the default 0 would be published behind lower values)."""
    await enqueue_spread(pool, "r", "SELECT 'a'", 1, "-7")
    await pool.execute("DELETE FROM dispatcher.outbox")
    await pool.execute(
        "UPDATE dispatcher.job_state SET state = 'running', attempt = 1, lease_owner = 'gone',"
        " lease_expires_at = now() - interval '1 second', started_at = now()"
    )
    assert await repo.rescue_expired_leases(10) == {"ready": 1}
    assert await pool.fetchval("SELECT priority FROM dispatcher.outbox") == -7


_RELAY_INDEX_PAGES = (
    "SELECT pg_stat_get_xact_blocks_fetched('dispatcher.outbox_to_relay'::regclass)"
)


async def test_the_pick_descends_to_its_cursor_with_a_kept_plan(
    pool: asyncpg.Pool, relay: RelayRepository
) -> None:
    """Behind a transaction pooler the daemon's sessions plan as the server does (plans kept
    after five calls), so each read of the relay's pick must be one a kept plan descends to:
    with min() for the next priority and an OR on the cursor, a pick from after a tenant of
    20,000 rows read all of them twice (254 pages) on every call; 15 now."""
    await enqueue_spread(pool, "big", "SELECT 'a-big'", 20_000)
    await enqueue_spread(pool, "s", "SELECT 'b' || lpad(g::text, 3, '0') FROM "
                         "generate_series(1, 40) g", 1)  # fmt: skip
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        before = await conn.fetchval(_RELAY_INDEX_PAGES)
        picked = await conn.fetch("SELECT * FROM dispatcher.relay_pick('default', 3, 0, 'a-big')")
        pages = await conn.fetchval(_RELAY_INDEX_PAGES) - before
    assert [r["tenant"] for r in picked] == ["b001", "b002", "b003"]
    assert pages < 40, pages
