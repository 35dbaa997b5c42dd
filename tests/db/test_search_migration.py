"""Migration 039 on a table that already has its search indexes: docs/guides/operating.md tells
operators of a large table to build them with CREATE INDEX CONCURRENTLY (and to create pg_trgm)
before upgrading. The migration must keep those (build nothing twice), rebuild one that a failed
concurrent build left invalid, and leave every search index valid."""

from __future__ import annotations

from pathlib import Path

import asyncpg

from dispatcher.db import schema
from tests.docs_blocks import blocks

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "operating.md"
INDEXES = ("jobs_key_prefix", "jobs_concurrency_key_id", "jobs_last_error_trgm")


def documented_statements() -> list[str]:
    """The statements of the guide's block that names this test."""
    (block,) = [
        b for b in blocks(GUIDE) if b.marker == ("tested-by", f"tests/db/{Path(__file__).name}")
    ]
    statements = [s.strip() for s in block.text.split(";") if s.strip()]
    assert len(statements) == 4, statements
    return statements


async def index_states(conn: asyncpg.Connection) -> dict[str, tuple[int, bool]]:
    rows = await conn.fetch(
        """SELECT c.relname, c.oid, i.indisvalid
             FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
            WHERE c.relnamespace = 'dispatcher'::regnamespace""",
    )
    return {r["relname"]: (r["oid"], r["indisvalid"]) for r in rows}


async def test_indexes_built_concurrently_beforehand_are_kept_and_invalid_ones_rebuilt(
    empty_db_url: str,
) -> None:
    conn = await asyncpg.connect(empty_db_url)
    try:
        await schema.migrate(conn, upto=38)
        for statement in documented_statements():
            await conn.execute(statement)  # one at a time, outside any transaction
        # what a concurrent build that failed half-way leaves behind
        await conn.execute(
            "UPDATE pg_index SET indisvalid = false"
            " WHERE indexrelid = 'dispatcher.jobs_concurrency_key_id'::regclass"
        )
        before = await index_states(conn)

        applied = await schema.migrate(conn, upto=39)
        assert [name for name in applied if not name.startswith("functions/")] == [
            "039_list_search.sql"
        ]

        after = await index_states(conn)
        for name in INDEXES:
            assert after[name][1], f"{name} is not valid"
        kept = {n for n in INDEXES if after[n][0] == before[n][0]}
        assert kept == {"jobs_key_prefix", "jobs_last_error_trgm"}
    finally:
        await conn.close()
