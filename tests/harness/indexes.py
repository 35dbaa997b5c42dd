"""The dispatcher schema's indexes as the catalog holds them, for the tests of migrations that
must keep indexes an operator built beforehand with CREATE INDEX CONCURRENTLY."""

from __future__ import annotations

import asyncpg


async def index_states(conn: asyncpg.Connection) -> dict[str, tuple[int, bool]]:
    """Every index of the dispatcher schema: name -> (oid, valid). A kept index keeps its oid."""
    rows = await conn.fetch(
        """SELECT c.relname, c.oid, i.indisvalid
             FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
            WHERE c.relnamespace = 'dispatcher'::regnamespace""",
    )
    return {r["relname"]: (r["oid"], r["indisvalid"]) for r in rows}


async def fail_half_way(conn: asyncpg.Connection, index: str) -> None:
    """What a concurrent build that failed half-way leaves behind: the index, marked invalid."""
    await conn.execute(
        "UPDATE pg_index SET indisvalid = false WHERE indexrelid = $1::regclass",
        f"dispatcher.{index}",
    )
