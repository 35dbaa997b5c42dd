"""Migration 050 on a table that already has its index: docs/guides/operating.md tells operators
of a large table to build it with CREATE INDEX CONCURRENTLY before upgrading. The migration must
keep it (build nothing twice), rebuild one that a failed concurrent build left invalid, and drop
the old index that held every job."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest

from dispatcher.db import schema
from tests.docs_blocks import blocks_tested_by
from tests.harness.indexes import fail_half_way, index_states

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "operating.md"
NEW, OLD = "job_state_due_at_rest", "jobs_due_at_id"


def documented_statements() -> list[str]:
    (block,) = blocks_tested_by(GUIDE, f"tests/db/{Path(__file__).name}")
    return [s.strip() for s in block.text.split(";") if s.strip()]


@pytest.mark.parametrize("left_invalid", [False, True], ids=["built", "failed half-way"])
async def test_an_index_built_beforehand_is_kept_an_invalid_one_rebuilt_and_the_old_dropped(
    empty_db_url: str, left_invalid: bool
) -> None:
    conn = await asyncpg.connect(empty_db_url)
    try:
        await schema.migrate(conn, upto=49)
        for statement in documented_statements():
            await conn.execute(statement)
        if left_invalid:
            await fail_half_way(conn, NEW)
        before = await index_states(conn)
        assert OLD in before
        applied = await schema.migrate(conn, upto=50)
        assert [n for n in applied if not n.startswith("functions/")] == [
            "050_due_index_at_rest.sql"
        ]
        after = await index_states(conn)
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
