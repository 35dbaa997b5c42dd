"""Claims on the few connections every claim loop shares (db/claims.py): kept between claims,
each claim planned for the table as it is then; at most `size` open whatever the number of
loops; a broken connection is replaced, a failed one goes back to its pool; a loop that cannot
get one says so once per episode and `problem()` says it meanwhile."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator

import asyncpg
import pytest

from dispatcher.db import claims as claims_module
from dispatcher.db.claims import ClaimConnections, _open
from dispatcher.db.pool import create_pool
from dispatcher.db.queries import query
from dispatcher.errors import ClaimsStarved
from tests.harness import wait_until

CAPABILITIES = ["noop:1"]


async def enqueue(pool: asyncpg.Pool, *keys: str, queue: str = "default") -> None:
    for key in keys:
        await pool.execute("SELECT dispatcher.enqueue($1, 'noop', queue => $2)", key, queue)


@pytest.fixture
async def noop_pool(pool: asyncpg.Pool) -> asyncpg.Pool:
    await pool.execute("INSERT INTO dispatcher.handlers (name, kind) VALUES ('noop', 'python')")
    return pool


@pytest.fixture
async def claim_pool(db_url: str, noop_pool: asyncpg.Pool) -> AsyncIterator[asyncpg.Pool]:
    """The daemon's `claims` pool: its own application_name, so its connections can be counted."""
    pool = await create_pool(db_url, size=3, application_name="test:claims", min_size=0)
    yield pool
    await asyncio.wait_for(pool.close(), 10)


async def open_claim_connections(pool: asyncpg.Pool) -> int:
    return int(
        await pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'test:claims'"
        )
    )


async def test_claims_reuse_a_kept_connection_and_are_planned_each_time(
    noop_pool: asyncpg.Pool, claim_pool: asyncpg.Pool
) -> None:
    """A generic plan, built once on a nearly empty table, walked the jobs' tables sequentially
    once a burst had landed (544 ms instead of 12 ms for a claim of 1,000)."""
    claims = ClaimConnections(claim_pool, 3)
    try:
        for i in range(8):
            await enqueue(noop_pool, f"job-{i}")
            jobs, taken, wait_s, *_ = await claims.claim("default", 10, CAPABILITIES, "me", 60)
            assert ([j.key for j in jobs], taken, wait_s) == ([f"job-{i}"], 1, None)
        [conn] = claims._idle  # one claim at a time: one connection did them all
        generic, custom = await conn.fetchrow(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1",
            query("claim_ready"),
        )
        assert (generic, custom) == (0, 8)
    finally:
        await claims.close()


async def test_any_number_of_loops_share_at_most_size_connections(
    noop_pool: asyncpg.Pool, claim_pool: asyncpg.Pool
) -> None:
    """The defect: a connection kept per queue (60 queues held 66 connections idle)."""
    queues = [f"q{i}" for i in range(60)]
    await noop_pool.execute(
        "INSERT INTO dispatcher.queues (name, max_attempts, max_retry_age_s) "
        "SELECT unnest($1::text[]), 10, 86400",
        queues,
    )
    for q in queues:
        await enqueue(noop_pool, f"{q}-job", queue=q)
    claims = ClaimConnections(claim_pool, 3)
    try:
        results = await asyncio.gather(
            *(claims.claim(q, 10, CAPABILITIES, "me", 60) for q in queues for _ in range(3))
        )
        assert sorted(j.key for claim in results for j in claim.jobs) == sorted(
            f"{q}-job" for q in queues
        )
        assert 1 <= await open_claim_connections(noop_pool) <= 3
        assert claims.problem() is None
    finally:
        await claims.close()
    assert await open_claim_connections(noop_pool) <= 3  # handed back to the pool, not leaked


async def test_a_claim_connection_the_server_closed_is_replaced(
    noop_pool: asyncpg.Pool, claim_pool: asyncpg.Pool
) -> None:
    claims = ClaimConnections(claim_pool, 1)
    try:
        await claims.claim("default", 10, CAPABILITIES, "me", 60)
        [conn] = claims._idle
        await noop_pool.execute("SELECT pg_terminate_backend($1)", conn.get_server_pid())
        await wait_until(lambda: not _open(conn), what="the driver noticing the closed connection")
        await enqueue(noop_pool, "after-the-cut")
        jobs, *_ = await claims.claim("default", 10, CAPABILITIES, "me", 60)
        assert [j.key for j in jobs] == ["after-the-cut"]
    finally:
        await claims.close()


async def test_a_failed_claim_hands_its_connection_back(
    noop_pool: asyncpg.Pool, claim_pool: asyncpg.Pool
) -> None:
    claims = ClaimConnections(claim_pool, 1)
    try:
        await claims.claim("default", 10, CAPABILITIES, "me", 60)
        await enqueue(noop_pool, "next")
        with pytest.raises(asyncpg.PostgresError):  # no lease is that long: the claim fails
            await claims.claim("default", 10, CAPABILITIES, "me", float("inf"))
        assert claims._idle == []
        jobs, *_ = await claims.claim("default", 10, CAPABILITIES, "me", 60)
        assert [j.key for j in jobs] == ["next"]
    finally:
        await claims.close()


async def test_close_hands_the_connections_back_reset(
    noop_pool: asyncpg.Pool, claim_pool: asyncpg.Pool
) -> None:
    claims = ClaimConnections(claim_pool, 3)
    await asyncio.gather(*(claims.claim("default", 10, CAPABILITIES, "me", 60) for _ in range(6)))
    assert claims._idle
    await claims.close()
    await claims.close()  # idempotent
    assert claims._idle == []
    conns = [await claim_pool.acquire(timeout=5) for _ in range(3)]  # all three free again
    for conn in conns:
        await claim_pool.release(conn)


async def test_ready_left_counts_only_jobs_this_worker_can_run(
    noop_pool: asyncpg.Pool, claim_pool: asyncpg.Pool
) -> None:
    claims = ClaimConnections(claim_pool, 1)
    try:
        assert not await claims.ready_left("default", CAPABILITIES)
        await enqueue(noop_pool, "one", "two")
        assert await claims.ready_left("default", CAPABILITIES)
        assert not await claims.ready_left("default", ["noop:2"])  # another version's worker
        assert not await claims.ready_left("other", CAPABILITIES)
        jobs, *_ = await claims.claim("default", 10, CAPABILITIES, "me", 60)
        assert len(jobs) == 2
        assert not await claims.ready_left("default", CAPABILITIES)
    finally:
        await claims.close()


@pytest.fixture
async def limited_role(noop_pool: asyncpg.Pool) -> AsyncIterator[str]:
    """A role the server lets open one connection: its second gets TooManyConnectionsError."""
    role = f"claimer_{os.getpid()}"
    await noop_pool.execute(f"DROP ROLE IF EXISTS {role}")
    # superusers are exempt from a connection limit: this one may only read and write data
    await noop_pool.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 1")
    await noop_pool.execute(f"GRANT pg_read_all_data, pg_write_all_data TO {role}")
    yield role
    await noop_pool.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role
    )
    await noop_pool.execute(f"DROP ROLE IF EXISTS {role}")


async def test_refused_connections_are_one_episode_said_once(
    db_url: str,
    noop_pool: asyncpg.Pool,
    limited_role: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """120 loops logged 244 `TooManyConnectionsError` lines in 12 s: now `problem()` says it,
    one line says it began and one that it ended, and nobody asks the server again for
    REFUSED_RETRY_S."""
    monkeypatch.setattr(claims_module, "REFUSED_RETRY_S", 0.3)
    url = db_url.replace("postgres@", f"{limited_role}@")
    hog = await asyncpg.connect(url)  # the role's only slot
    pool = await create_pool(url, size=2, application_name="test:claims", min_size=0)
    claims = ClaimConnections(pool, 2)
    caplog.set_level(logging.INFO, logger="dispatcher.db.claims")
    try:
        for _ in range(20):
            with pytest.raises(ClaimsStarved, match="TooManyConnectionsError"):
                await claims.claim("default", 10, CAPABILITIES, "me", 60)
        assert "TooManyConnectionsError" in (claims.problem() or "")
        await hog.close()
        await enqueue(noop_pool, "after")

        async def claimed() -> bool:
            try:
                jobs, *_ = await claims.claim("default", 10, CAPABILITIES, "me", 60)
            except ClaimsStarved:
                return False
            return [j.key for j in jobs] == ["after"]

        await wait_until(claimed, timeout_s=10, interval_s=0.05, what="a claim once refused")
        assert claims.problem() is None
        lines = [r.getMessage() for r in caplog.records if r.name == "dispatcher.db.claims"]
        assert len(lines) == 2, lines
        assert "cannot get a database connection" in lines[0]
        assert "again, after" in lines[1]
    finally:
        await claims.close()
        await asyncio.wait_for(pool.close(), 10)
        if not hog.is_closed():
            await hog.close()


async def test_loops_waiting_too_long_for_a_busy_connection_are_starved(
    noop_pool: asyncpg.Pool, claim_pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(claims_module, "STARVED_AFTER_S", 0.2)
    claims = ClaimConnections(claim_pool, 1)
    try:
        async with claims._borrow():  # the only claim connection, busy
            waiting = asyncio.create_task(claims.claim("default", 10, CAPABILITIES, "me", 60))
            await wait_until(lambda: claims.problem() is not None, timeout_s=5, what="starved")
            assert "all 1 claim connections stayed busy" in (claims.problem() or "")
        await waiting
        assert claims.problem() is None
    finally:
        await claims.close()
