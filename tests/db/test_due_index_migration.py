"""Migration 050 on a table that already has its index: docs/guides/operating.md tells operators
of a large table to build it with CREATE INDEX CONCURRENTLY before upgrading. The migration must
keep it (build nothing twice), rebuild one that a failed concurrent build left invalid, and drop
the old index that held every job."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest

from tests.docs_blocks import blocks_tested_by, sql_statements
from tests.harness.indexes import upgrade_after_the_guides_block

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "operating.md"
NEW, OLD = "job_state_due_at_rest", "jobs_due_at_id"


@pytest.mark.parametrize("left_invalid", [False, True], ids=["built", "failed half-way"])
async def test_an_index_built_beforehand_is_kept_an_invalid_one_rebuilt_and_the_old_dropped(
    empty_db_url: str, left_invalid: bool
) -> None:
    (block,) = blocks_tested_by(GUIDE, f"tests/db/{Path(__file__).name}")
    conn = await asyncpg.connect(empty_db_url)
    try:
        before, after = await upgrade_after_the_guides_block(
            conn, "050_due_index_at_rest.sql", sql_statements(block), NEW if left_invalid else None
        )
        assert OLD in before
        assert after[NEW][1], after
        assert (after[NEW][0] == before[NEW][0]) is not left_invalid  # kept, or built anew
        assert OLD not in after
        predicate = await conn.fetchval(
            "SELECT pg_get_expr(indpred, indrelid) FROM pg_index"
            " WHERE indexrelid = 'dispatcher.job_state_due_at_rest'::regclass"
        )
        assert "ready" in predicate and "running" in predicate
    finally:
        await conn.close()
