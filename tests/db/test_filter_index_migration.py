"""Migration 048 on a table that already has its indexes: docs/guides/operating.md tells
operators of a large table to build them with CREATE INDEX CONCURRENTLY before upgrading. The
migration must keep those (build nothing twice), rebuild one that a failed concurrent build left
invalid, drop the state rows' old filter indexes, and the list's filters must still find the
same jobs."""

from __future__ import annotations

from pathlib import Path

import asyncpg

from dispatcher.db import schema
from tests.docs_blocks import blocks_tested_by, sql_statements
from tests.harness.indexes import check_moved_indexes

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "operating.md"


async def test_indexes_built_beforehand_are_kept_invalid_ones_rebuilt_and_old_ones_dropped(
    empty_db_url: str,
) -> None:
    (block,) = blocks_tested_by(GUIDE, f"tests/db/{Path(__file__).name}")
    old = ["jobs_priority_id", "jobs_concurrency_key_id"]
    await check_moved_indexes(
        empty_db_url,
        sql_statements(block),
        "048_filter_indexes_on_intents.sql",
        "intents_priority_id",
        "intents_concurrency_key_id",
        old,
    )


async def test_the_filters_find_the_jobs_through_the_intents(empty_db_url: str) -> None:
    conn = await asyncpg.connect(empty_db_url)
    try:
        await schema.migrate(conn)
        await conn.execute("INSERT INTO dispatcher.handlers (name, kind) VALUES ('h', 'python')")
        await conn.execute(
            "SELECT count(*) FROM dispatcher.enqueue_many(ARRAY['a', 'b', 'c'],"
            " ARRAY['h', 'h', 'h'], ARRAY['{}', '{}', '{}']::jsonb[],"
            " tenants => ARRAY['acme', 'acme', 'bravo'], priorities => ARRAY[0, -5, -5])"
        )
        # an operator's change through the view reaches the intent the filter reads
        await conn.execute("UPDATE dispatcher.jobs SET priority = 7 WHERE key = 'c'")
        by_priority = await conn.fetch(
            "SELECT key, priority FROM dispatcher.jobs WHERE priority <> 0 ORDER BY key"
        )
        assert [tuple(r) for r in by_priority] == [("b", -5), ("c", 7)]
        acme = await conn.fetch(
            "SELECT key FROM dispatcher.jobs WHERE concurrency_key = 'acme' ORDER BY key"
        )
        assert [r["key"] for r in acme] == ["a", "b"]
        state = await conn.fetchval(
            "SELECT s.priority FROM dispatcher.job_state s JOIN dispatcher.intents i USING (id)"
            " WHERE i.key = 'c'"
        )
        assert state == 7  # the claim reads the state row's, changed with it
    finally:
        await conn.close()
