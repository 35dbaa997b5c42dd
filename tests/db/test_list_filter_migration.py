"""Migration 009 on a table that already has some of its indexes: docs/guides/operating.md
tells operators of a large table to build them with CREATE INDEX CONCURRENTLY before upgrading.
The migration must keep those (build nothing twice), rebuild one a failed concurrent build left
invalid, and leave every filter index valid."""

from __future__ import annotations

import re
from pathlib import Path

import asyncpg

from dispatcher.db import schema
from tests.harness.indexes import fail_half_way, index_states

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "operating.md"
INDEXES = ("jobs_tenant_id", "jobs_handler_id", "jobs_run_key_id", "jobs_due_at_id")


def documented_statements() -> list[str]:
    """The CREATE INDEX CONCURRENTLY statements of the operating guide's upgrade note."""
    found = re.findall(r"^CREATE INDEX CONCURRENTLY IF NOT EXISTS .*;$", GUIDE.read_text(), re.M)
    assert len(found) == len(INDEXES), found
    return found


async def test_indexes_built_concurrently_beforehand_are_kept_and_invalid_ones_rebuilt(
    empty_db_url: str,
) -> None:
    conn = await asyncpg.connect(empty_db_url)
    try:
        await schema.migrate(conn, upto=8)
        await conn.execute(
            "INSERT INTO dispatcher.jobs (key, request_hash, queue, tenant, handler, payload,"
            " state, due_at, max_attempts, max_retry_age_s, budget_started_at, run_key)"
            " SELECT 'k-' || g, 'h', 'default', 't', 'http', '{}', 'scheduled', now(), 1, 0,"
            " now(), 'r:' || g FROM generate_series(1, 100) g"
        )
        for statement in documented_statements():
            await conn.execute(statement)  # one at a time, outside any transaction
        await fail_half_way(conn, "jobs_handler_id")
        before = await index_states(conn)

        assert await schema.migrate(conn, upto=9) == ["009_list_filters.sql"]

        after = await index_states(conn)
        assert "jobs_run_key" not in after
        for name in INDEXES:
            assert after[name][1], f"{name} is not valid"
        kept = {n for n in INDEXES if after[n][0] == before[n][0]}
        assert kept == {"jobs_tenant_id", "jobs_run_key_id", "jobs_due_at_id"}
    finally:
        await conn.close()
