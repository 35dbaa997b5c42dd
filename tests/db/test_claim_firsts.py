"""Many small tenants in one read (db/functions/10_claim_firsts.sql, issue 22): when tenants
hold few ready jobs each, a claim takes the first job of each of the next tenants in turn order
from one read of the claim index instead of two index probes per tenant. The turns must be the
walk's (claim_pick): tenants in name order from the claimer's cursor, wrapping round, one job
each, earliest due first; the rest of a claim the read cannot fill goes to the walk.
"""

from __future__ import annotations

import asyncpg
import pytest

from dispatcher.db.jobs import JobRepository
from tests.db.test_claim_order import CAPS, drain_order, enqueue_spread, noop  # noqa: F401

TENANTS = "SELECT 't' || lpad(g::text, 4, '0') FROM generate_series(1, {n}) g"
_CLAIM = "SELECT * FROM dispatcher.claim_ready('default', $1, $2, 'd0', 600, $3, true, $4, $5)"
_FIRSTS_CALLS = (
    "SELECT coalesce(pg_stat_get_xact_function_calls('dispatcher.claim_firsts'::regproc), 0)"
)

Cursor = tuple[int, str] | tuple[None, None]


async def claim_counted(
    conn: asyncpg.Connection, n: int, cursor: Cursor = (None, None)
) -> tuple[list[str], Cursor, int]:
    """Claim `n` from `cursor` in a transaction of its own: the keys in claim order, the next
    cursor, and how often the claim called claim_firsts (counted by the server)."""
    async with conn.transaction():
        await conn.execute("SET LOCAL track_functions = 'pl'")
        before = await conn.fetchval(_FIRSTS_CALLS)
        rows = await conn.fetch(_CLAIM, n, CAPS, 2**62, *cursor)
        calls = await conn.fetchval(_FIRSTS_CALLS) - before
    marker = rows[-1]
    keys = await conn.fetch(
        "SELECT key FROM unnest($1::bigint[]) WITH ORDINALITY u(id, n)"
        " JOIN dispatcher.intents i USING (id) ORDER BY u.n",
        [r["id"] for r in rows[:-1]],
    )
    return [k["key"] for k in keys], (marker["cursor_priority"], marker["cursor_tenant"]), calls


def names(first: int, last: int) -> list[str]:
    return [f"t{g:04d}" for g in range(first, last + 1)]


async def test_small_tenants_take_one_turn_each_from_one_read_per_claim(
    noop: asyncpg.Pool,  # noqa: F811
) -> None:
    await enqueue_spread(noop, "d", TENANTS.format(n=3000), 2)
    async with noop.acquire() as conn:
        cursor: Cursor = (None, None)
        for turn in range(2):  # every tenant's first job, then every tenant's second
            for k in range(6):
                keys, cursor, calls = await claim_counted(conn, 500, cursor)
                expected = names(k * 500 + 1, (k + 1) * 500)
                assert keys == [f"d-{t}-{turn + 1}" for t in expected], (turn, k, keys[:3])
                assert calls == 1
        assert (await claim_counted(conn, 500, cursor))[0] == []


async def test_the_read_wraps_round_from_the_cursor(noop: asyncpg.Pool) -> None:  # noqa: F811
    await enqueue_spread(noop, "w", TENANTS.format(n=3000), 1)
    async with noop.acquire() as conn:
        keys, cursor, calls = await claim_counted(conn, 500, (0, "t2800"))
    assert keys == [f"w-{t}-1" for t in names(2801, 3000) + names(1, 300)]
    assert cursor == (0, "t0300") and calls == 1


async def test_a_big_tenant_among_small_ones_keeps_one_turn_a_round(
    noop: asyncpg.Pool,  # noqa: F811
) -> None:
    """The read runs into a tenant of 3,000 jobs between 2,000 tenants of one: every small
    tenant still starts within one turn of all the others, and the big one's jobs start
    earliest due first."""
    await enqueue_spread(noop, "a", "SELECT 'a' || lpad(g::text, 4, '0') FROM "
                         "generate_series(1, 1000) g", 1)  # fmt: skip
    await enqueue_spread(noop, "m", "SELECT 'm'", 3000)
    await enqueue_spread(noop, "z", "SELECT 'z' || lpad(g::text, 4, '0') FROM "
                         "generate_series(1, 1000) g", 1)  # fmt: skip
    async with noop.acquire() as conn:
        started: list[str] = []
        cursor: Cursor = (None, None)
        while True:
            keys, cursor, _ = await claim_counted(conn, 400, cursor)
            if not keys:
                break
            started += keys
    assert len(started) == len(set(started)) == 5000
    small = [i for i, k in enumerate(started) if not k.startswith("m-")]
    assert small[-1] < 2001 + 400, small[-1]  # one turn of the 2,001 tenants, and a claim
    big = [int(k.rsplit("-", 1)[1]) for k in started if k.startswith("m-")]
    assert big == sorted(big)


async def test_jobs_the_worker_cannot_run_are_passed_over(noop: asyncpg.Pool) -> None:  # noqa: F811
    await enqueue_spread(noop, "c", TENANTS.format(n=600), 2)
    await noop.execute(
        "UPDATE dispatcher.job_state SET capability = 'other:1'"
        " WHERE id IN (SELECT id FROM dispatcher.intents WHERE key LIKE 'c-%-1')"
    )
    async with noop.acquire() as conn:
        keys, _, calls = await claim_counted(conn, 500)
    assert keys == [f"c-{t}-2" for t in names(1, 500)] and calls == 1
    assert (
        await noop.fetchval(
            "SELECT count(*) FROM dispatcher.job_state WHERE capability = 'other:1'"
            " AND state = 'ready'"
        )
        == 600
    )


async def test_two_claims_at_once_take_different_jobs(
    noop: asyncpg.Pool,  # noqa: F811
    repo: JobRepository,
) -> None:
    """The second claim's read finds the first's jobs locked and passes over them; the walk
    fills the rest of it from the same tenants' next jobs."""
    await enqueue_spread(noop, "p", TENANTS.format(n=1000), 2)
    async with noop.acquire() as one, noop.acquire() as two, one.transaction():
        first = await one.fetch(_CLAIM, 500, CAPS, 2**62, None, None)
        second = await two.fetch(_CLAIM, 500, CAPS, 2**62, None, None)
    ids_one = {r["id"] for r in first[:-1]}
    ids_two = {r["id"] for r in second[:-1]}
    assert len(ids_one) == len(ids_two) == 500
    assert not ids_one & ids_two
    assert (
        await noop.fetchval("SELECT count(*) FROM dispatcher.job_state WHERE state = 'running'")
        == 1000
    )
    # and nothing is left out: the rest drains to the last job
    assert len(await drain_order(repo)) == 1000


async def test_keys_at_their_limit_are_passed_over_and_the_rest_claimed(
    noop: asyncpg.Pool,  # noqa: F811
    repo: JobRepository,
) -> None:
    """One job per key at a time (a key is its tenant): the first claim takes 500 tenants'
    first jobs, the next one only the 100 tenants not yet running, never a second job of a
    tenant at its limit."""
    await repo.sync_registry(
        {"default": (3, 3600)},
        {"noop": ("python", 1)},
        limits={"default": (None, None, None)},
        key_limits={"default": (None, None, 1)},
    )
    await enqueue_spread(noop, "k", TENANTS.format(n=600), 2)
    async with noop.acquire() as conn:
        first, cursor, calls = await claim_counted(conn, 500)
        assert first == [f"k-{t}-1" for t in names(1, 500)] and calls == 1
        rest, _, _ = await claim_counted(conn, 500, cursor)
    assert rest == [f"k-{t}-1" for t in names(501, 600)]


_CLAIM_INDEX_PAGES = (
    "SELECT pg_stat_get_xact_blocks_fetched('dispatcher.jobs_ready_claim'::regclass)"
)


@pytest.mark.parametrize("wanted", [1, 32], ids=["the walk", "the read"])
async def test_a_claim_descends_to_its_cursor_past_a_big_tenant(
    noop: asyncpg.Pool,  # noqa: F811
    wanted: int,
) -> None:
    """The tenants after the cursor are found by one descent of the claim index, not by reading
    every entry before the cursor: a tenant of 20,000 ready jobs named before it costs a claim
    nothing (written `(priority, tenant) > cursor` beside `priority = lvl`, PostgreSQL read all
    of its entries, about 130 pages, on every claim, by the walk and by the read alike)."""
    await enqueue_spread(noop, "big", "SELECT 'a-big'", 20_000)
    await enqueue_spread(noop, "s", "SELECT 'b' || lpad(g::text, 3, '0') FROM "
                         "generate_series(1, 40) g", 1)  # fmt: skip
    async with noop.acquire() as conn, conn.transaction():
        before = await conn.fetchval(_CLAIM_INDEX_PAGES)
        rows = await conn.fetch(_CLAIM, wanted, CAPS, 2**62, 0, "a-big")
        pages = await conn.fetchval(_CLAIM_INDEX_PAGES) - before
    tenants = await noop.fetch(
        "SELECT i.tenant FROM unnest($1::bigint[]) WITH ORDINALITY u(id, n)"
        " JOIN dispatcher.intents i USING (id) ORDER BY u.n",
        [r["id"] for r in rows[:-1]],
    )
    assert [t["tenant"] for t in tenants] == [f"b{g:03d}" for g in range(1, wanted + 1)]
    assert pages < 40, pages  # 10 and 12 here; 130 and 252 before
