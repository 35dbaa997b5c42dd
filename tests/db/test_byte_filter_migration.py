"""Migration 055 on a table that already has its indexes: docs/guides/operating.md tells
operators of a large table to build them with CREATE INDEX CONCURRENTLY before upgrading. The
migration must keep those (build nothing twice), rebuild one that a failed concurrent build left
invalid and drop the old ones; the list's handler and tenant filters find the same jobs through
the byte-ordered indexes."""

from __future__ import annotations

from pathlib import Path

import asyncpg

from dispatcher.db import schema
from dispatcher.db.job_reads import list_args
from dispatcher.db.queries import query
from dispatcher.model import JobFilter
from tests.docs_blocks import blocks_tested_by, sql_statements
from tests.harness.indexes import check_moved_indexes

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "operating.md"


async def test_indexes_built_beforehand_are_kept_invalid_ones_rebuilt_and_old_ones_dropped(
    empty_db_url: str,
) -> None:
    (block,) = blocks_tested_by(GUIDE, f"tests/db/{Path(__file__).name}")
    old = ["jobs_handler_id", "jobs_tenant_id"]
    await check_moved_indexes(
        empty_db_url,
        sql_statements(block),
        "055_list_filters_in_bytes.sql",
        "intents_handler_id",
        "intents_tenant_id",
        old,
    )


async def test_the_list_finds_a_handlers_and_a_tenants_jobs_compared_in_bytes(
    empty_db_url: str,
) -> None:
    """Names that a linguistic collation orders apart from their bytes (case, accents) are
    found exactly, and only themselves."""
    conn = await asyncpg.connect(empty_db_url)
    try:
        await schema.migrate(conn)
        await conn.execute(
            "INSERT INTO dispatcher.handlers (name, kind) VALUES ('mail', 'python'),"
            " ('Mail', 'python')"
        )
        await conn.execute(
            "SELECT count(*) FROM dispatcher.enqueue_many(ARRAY['a', 'b', 'c', 'd'],"
            " ARRAY['mail', 'Mail', 'mail', 'mail'], ARRAY['{}', '{}', '{}', '{}']::jsonb[],"
            " tenants => ARRAY['café', 'cafe', 'Café', 'café'])"
        )

        async def listed(**filters: str) -> list[str]:
            rows = await conn.fetch(
                query("list_jobs"), *list_args("list_jobs", JobFilter(**filters), None, 100)
            )
            return sorted(r["key"] for r in rows)

        assert await listed(handler="mail") == ["a", "c", "d"]
        assert await listed(handler="Mail") == ["b"]
        assert await listed(tenant="café") == ["a", "d"]
        assert await listed(tenant="café", handler="Mail") == []
    finally:
        await conn.close()
