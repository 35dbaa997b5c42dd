"""The queue tables are vacuumed early, and the daemon says when nothing will vacuum them."""

from __future__ import annotations

import logging
from typing import Any

import asyncpg
import pytest

from dispatcher.db.jobs import JobRepository
from dispatcher.db.vacuum import vacuum_problems
from dispatcher.runtime.database import prepare_schema
from tests.harness import enqueue_noop_jobs, make_settings


async def reloptions(pool: asyncpg.Pool, table: str) -> set[str]:
    options = await pool.fetchval("SELECT reloptions FROM pg_class WHERE oid = $1::regclass", table)
    return set(options or [])


async def test_migrations_lower_the_autovacuum_triggers_of_the_queue_tables(
    pool: asyncpg.Pool,
) -> None:
    assert {
        "autovacuum_vacuum_scale_factor=0.01",
        "autovacuum_vacuum_threshold=1000",
        "vacuum_index_cleanup=on",
    } <= await reloptions(pool, "dispatcher.job_state")
    assert {
        "autovacuum_vacuum_scale_factor=0",
        "autovacuum_vacuum_threshold=5000",
    } <= await reloptions(pool, "dispatcher.outbox")
    assert {
        "autovacuum_vacuum_scale_factor=0",
        "autovacuum_vacuum_threshold=2000",
    } <= await reloptions(pool, "dispatcher.outbox_messages")


FUTURE = 100_000  # future jobs: the jobs done below leave dead rows on under 2 % of the pages
DONE = 400


async def ready_probe_pages(pool: asyncpg.Pool) -> int:
    """The pages a claim's first probe reads to find a queue's first ready job (none here)."""
    plans = await pool.fetchval(  # the pool's codec decodes EXPLAIN's JSON
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT 1 FROM dispatcher.job_state"
        " WHERE queue = 'default' AND state = 'ready' ORDER BY queue, priority, tenant LIMIT 1"
    )
    node = plans[0]["Plan"]
    return int(node["Shared Hit Blocks"] + node["Shared Read Blocks"])


async def test_a_vacuum_clears_the_claim_index_of_a_large_table(
    pool: asyncpg.Pool, repo: JobRepository
) -> None:
    """With PostgreSQL's default (vacuum_index_cleanup = auto) this vacuum skips the index pass,
    as the dead rows sit on few of the table's pages, and the claim index keeps the done jobs'
    entries, which every claim then walks (migration 056)."""
    await pool.execute("INSERT INTO dispatcher.handlers (name, kind) VALUES ('noop', 'python')")
    await enqueue_noop_jobs(pool, "future", FUTURE, "now() + interval '1 day'")
    await pool.execute("VACUUM dispatcher.job_state")
    await enqueue_noop_jobs(pool, "done", DONE)
    jobs, _ = await repo.claim("default", DONE, ["noop:1"], "owner", 60.0)
    assert len(jobs) == DONE
    held = await repo.complete(
        [j.id for j in jobs], [j.attempt for j in jobs], [None] * DONE, "owner"
    )
    assert len(held) == DONE
    dead_pages, pages = await pool.fetchrow(
        "SELECT count(DISTINCT (ctid::text::point)[0]) FILTER (WHERE state = 'succeeded') * 3,"
        " pg_relation_size('dispatcher.job_state') / current_setting('block_size')::int"
        " FROM dispatcher.job_state"
    )
    assert dead_pages < pages * 0.02  # where `auto` skips the index pass (the dead versions
    # of these jobs sit on the pages of their versions at most three times over)
    walked = await ready_probe_pages(pool)
    assert walked > 2  # the done jobs' entries, walked before a vacuum

    messages: list[str] = []

    def collect(_conn: Any, message: Any) -> None:
        messages.append(str(message.message))

    async with pool.acquire() as conn:
        conn.add_log_listener(collect)
        try:
            await conn.execute("VACUUM (VERBOSE) dispatcher.job_state")
        finally:
            conn.remove_log_listener(collect)
    reports = [m for m in messages if "dispatcher.job_state" in m and "index scans" in m]
    assert reports and "index scans: 1" in reports[0], messages
    after = await ready_probe_pages(pool)
    assert after < walked
    assert after <= 2  # the root and one empty leaf at most


@pytest.mark.parametrize("table", ["dispatcher.outbox", "dispatcher.outbox_messages"])
async def test_a_table_with_autovacuum_disabled_is_named_with_its_fix(
    pool: asyncpg.Pool, table: str
) -> None:
    server_off = await pool.fetchval("SELECT NOT current_setting('autovacuum')::bool")
    async with pool.acquire() as conn:
        baseline = await vacuum_problems(conn)
        # the server-wide check reports exactly what the server is set to
        assert len(baseline) == (1 if server_off else 0)
        assert all("autovacuum is off on this server" in p for p in baseline)

        await conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        problems = await vacuum_problems(conn)
        assert problems[: len(baseline)] == baseline
        assert problems[len(baseline) :] == [
            f"autovacuum is disabled for {table}: ALTER TABLE {table} RESET (autovacuum_enabled)"
        ]

        await conn.execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)")
        assert await vacuum_problems(conn) == baseline


async def test_the_daemon_warns_at_start_when_a_queue_table_is_not_vacuumed(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute("ALTER TABLE dispatcher.job_state SET (autovacuum_enabled = false)")
    finally:
        await conn.close()
    with caplog.at_level(logging.WARNING, logger="dispatcher"):
        await prepare_schema(db_url, make_settings(db_url))
    assert (
        "autovacuum is disabled for dispatcher.job_state: "
        "ALTER TABLE dispatcher.job_state RESET (autovacuum_enabled)"
    ) in caplog.messages


async def test_without_track_counts_autovacuum_cannot_tell_and_says_so(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        if not await conn.fetchval("SELECT current_setting('autovacuum')::bool"):
            pytest.skip("autovacuum is off on this server: that message comes first")
        await conn.execute("SET track_counts = off")
        try:
            assert await vacuum_problems(conn) == [
                "track_counts is off, so autovacuum cannot tell when the queue tables need it: "
                "set track_counts = on in postgresql.conf"
            ]
        finally:
            await conn.execute("RESET track_counts")
