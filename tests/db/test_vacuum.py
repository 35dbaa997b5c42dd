"""The queue tables are vacuumed early, and the daemon says when nothing will vacuum them."""

from __future__ import annotations

import logging

import asyncpg
import pytest

from dispatcher.db.vacuum import vacuum_problems
from dispatcher.runtime.database import prepare_schema
from tests.harness import make_settings


async def reloptions(pool: asyncpg.Pool, table: str) -> set[str]:
    options = await pool.fetchval("SELECT reloptions FROM pg_class WHERE oid = $1::regclass", table)
    return set(options or [])


async def test_migrations_lower_the_autovacuum_triggers_of_the_queue_tables(
    pool: asyncpg.Pool,
) -> None:
    assert {
        "autovacuum_vacuum_scale_factor=0.01",
        "autovacuum_vacuum_threshold=1000",
    } <= await reloptions(pool, "dispatcher.job_state")
    assert {
        "autovacuum_vacuum_scale_factor=0",
        "autovacuum_vacuum_threshold=5000",
    } <= await reloptions(pool, "dispatcher.outbox")
    assert {
        "autovacuum_vacuum_scale_factor=0",
        "autovacuum_vacuum_threshold=2000",
    } <= await reloptions(pool, "dispatcher.outbox_messages")


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
