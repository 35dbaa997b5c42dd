"""Migrations 039 and 042 on a table that already has their search indexes:
docs/guides/operating.md tells operators of a large table to build them with CREATE INDEX
CONCURRENTLY (and to create pg_trgm) before upgrading. Each migration must keep those (build
nothing twice), rebuild one that a failed concurrent build left invalid, and leave every search
index valid."""

from __future__ import annotations

from pathlib import Path

import asyncpg

from tests.docs_blocks import blocks_tested_by, sql_statements
from tests.harness.indexes import upgrade_after_the_guides_block

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "operating.md"
INDEXES = ("jobs_key_prefix", "jobs_concurrency_key_id", "jobs_last_error_trgm")


def documented_statements(migration: int) -> list[str]:
    """The statements of the guide's block for `migration` (the blocks that name this test,
    in the guide's order: 039's, then 042's)."""
    found = blocks_tested_by(GUIDE, f"tests/db/{Path(__file__).name}")
    assert len(found) == 2, found
    block = found[0] if migration == 39 else found[1]
    return sql_statements(block)


async def test_indexes_built_concurrently_beforehand_are_kept_and_invalid_ones_rebuilt(
    empty_db_url: str,
) -> None:
    conn = await asyncpg.connect(empty_db_url)
    try:
        statements = documented_statements(39)
        assert len(statements) == 4, statements
        before, after = await upgrade_after_the_guides_block(
            conn, "039_list_search.sql", statements, broken="jobs_concurrency_key_id"
        )
        for name in INDEXES:
            assert after[name][1], f"{name} is not valid"
        kept = {n for n in INDEXES if after[n][0] == before[n][0]}
        assert kept == {"jobs_key_prefix", "jobs_last_error_trgm"}
    finally:
        await conn.close()


async def test_the_key_prefix_index_built_concurrently_beforehand_is_kept(
    empty_db_url: str,
) -> None:
    conn = await asyncpg.connect(empty_db_url)
    try:
        statements = documented_statements(42)
        assert len(statements) == 3, statements
        before, after = await upgrade_after_the_guides_block(
            conn, "042_key_prefix_ids.sql", statements, broken="jobs_dead_reason_queue_id"
        )
        assert "jobs_key_prefix" not in before  # the guide's block dropped the old one
        for name in ("jobs_key_prefix_id", "jobs_dead_reason_queue_id"):
            assert after[name][1], f"{name} is not valid"
        assert after["jobs_key_prefix_id"][0] == before["jobs_key_prefix_id"][0]  # kept
        assert after["jobs_dead_reason_queue_id"][0] != before["jobs_dead_reason_queue_id"][0]
        assert "jobs_key_prefix" not in after
    finally:
        await conn.close()
