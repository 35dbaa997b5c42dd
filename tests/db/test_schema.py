"""The schema: migrations are idempotent, every named query prepares, the SQL door validates."""

from __future__ import annotations

import asyncpg
import pytest

from dispatcher.db import schema
from dispatcher.db.queries import all_queries
from tests.conftest import scratch_database


async def test_migrations_applied_twice_are_a_noop(db_url: str) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        assert await schema.migrate(conn) == []
        assert await schema.current_version(conn) == schema.latest_version()
        await schema.check_current(conn)
    finally:
        await conn.close()


async def test_fresh_database_gets_every_migration(server_url: str) -> None:
    async with scratch_database(server_url, "dispatcher_fresh") as url:
        conn = await asyncpg.connect(url)
        try:
            applied = await schema.migrate(conn)
            assert applied == [name for _, name, _ in schema.available()] + [
                f"functions/{name}" for name, _, _ in schema.function_files()
            ]
            assert await schema.migrate(conn) == []
        finally:
            await conn.close()


@pytest.mark.parametrize("name", sorted(all_queries()))
async def test_every_named_query_prepares(pool: asyncpg.Pool, name: str) -> None:
    async with pool.acquire() as conn:
        await conn.prepare(all_queries()[name])
